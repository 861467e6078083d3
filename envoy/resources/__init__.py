"""Builders of Envoy's resources (pure): clusters and endpoints per ``model@version``, the listener
with the gateway's ext_authz filter, routes on ``x-route-version``, batch and body routes, the
bootstrap, and the whole resource set from the desired state (:mod:`.build`).
"""
