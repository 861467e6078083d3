"""The AWS side of a region: network, EKS cluster, GPU node pools, IAM, weights buckets, and the
global latency routing between regions.
"""
