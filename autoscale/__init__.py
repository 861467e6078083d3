"""Autoscaling: KEDA ScaledObjects from measured capacity, and the one desired-replica rule.

- :mod:`autoscale.rule` -- ``desired_replicas``: KEDA + HPA semantics as one pure step;
- :mod:`autoscale.hpa` -- the HPA's arithmetic (tolerance, stabilisation, rate policies);
- :mod:`autoscale.policy` -- ``AutoscalePolicy`` (the seed's defaults) and derived thresholds;
- :mod:`autoscale.triggers` -- a pool's triggers, and readings for the rule;
- :mod:`autoscale.scaledobject` -- the ``keda.sh/v1alpha1`` ScaledObject per pool;
- :mod:`autoscale.naming` -- Deployment names, pod and Prometheus labels, PromQL, PodMonitor;
- :mod:`autoscale.drain` -- preStop, ``--shutdown-timeout`` and termination grace per version;
- :mod:`autoscale.cron` -- KEDA cron windows; :mod:`autoscale.promconfig` -- a static scrape config.
"""
