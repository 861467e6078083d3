"""Pulumi ComponentResources of modelfleet, and the program that wires them per stack.

| component | type token | module |
|---|---|---|
| ``Cluster`` | ``modelfleet:aws:Cluster`` | :mod:`components.cluster` |
| ``GpuNodePool`` | ``modelfleet:aws:GpuNodePool`` | :mod:`components.gpu_node_pool` |
| ``Addons`` | ``modelfleet:k8s:Addons`` | :mod:`components.addons` |
| ``ModelPool`` | ``modelfleet:k8s:ModelPool`` | :mod:`components.model_pool` |
| ``Gateway`` | ``modelfleet:k8s:Gateway`` | :mod:`components.gateway` |
| ``ControlPlane`` | ``modelfleet:k8s:ControlPlane`` | :mod:`components.control_plane` |
| ``WeightsBucket`` | ``modelfleet:aws:WeightsBucket`` | :mod:`components.weights_bucket` |
| ``GlobalRouting`` | ``modelfleet:aws:GlobalRouting`` | :mod:`components.global_routing` |

:mod:`components.program` holds ``region_stack`` and ``global_stack`` (called by
``infra/__main__.py`` and by ``modelfleet render``); Kubernetes objects are built as plain dicts by
the ``*_manifests`` modules; :mod:`components.mocking` runs a program under Pulumi's mocks. Nothing
here creates a resource at import time. See docs/deploy.md.
"""
