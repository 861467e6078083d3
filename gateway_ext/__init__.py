"""gateway_ext: the ext_authz service Envoy asks before routing any API request (team key, token
bucket, tier and admission, version and replica), and where replicas settle their real usage.
"""
