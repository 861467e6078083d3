"""The Kubernetes side of a region: the add-ons, the platform's services (control plane, gateway,
batch) and one pool per model version, as Pulumi components over plain-dict manifests.
"""
