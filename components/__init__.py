"""Pulumi ComponentResources of modelfleet, and the program that wires them per stack.

| component | type token | module |
|---|---|---|
| ``Cluster`` | ``modelfleet:aws:Cluster`` | :mod:`components.aws.cluster` |
| ``GpuNodePool`` | ``modelfleet:aws:GpuNodePool`` | :mod:`components.aws.gpu_node_pool` |
| ``Addons`` | ``modelfleet:k8s:Addons`` | :mod:`components.k8s.addons` |
| ``ModelPool`` | ``modelfleet:k8s:ModelPool`` | :mod:`components.k8s.model_pool` |
| ``Gateway`` | ``modelfleet:k8s:Gateway`` | :mod:`components.k8s.gateway` |
| ``ControlPlane`` | ``modelfleet:k8s:ControlPlane`` | :mod:`components.k8s.control_plane` |
| ``WeightsBucket`` | ``modelfleet:aws:WeightsBucket`` | :mod:`components.aws.weights_bucket` |
| ``GlobalRouting`` | ``modelfleet:aws:GlobalRouting`` | :mod:`components.aws.global_routing` |

:mod:`components.program` holds ``region_stack`` and ``global_stack`` (called by
``infra/__main__.py`` and by ``modelfleet render``); Kubernetes objects are built as plain dicts by
the ``*_manifests`` modules; :mod:`components.mocking` runs a program under Pulumi's mocks. Nothing
here creates a resource at import time. See docs/deploy.md.
"""
