"""The simulated fleet: regions with their gateway, pools of simulated replicas and scaler, the
clients with retries, DNS failover between regions, the canary controller, and what is measured.
"""
