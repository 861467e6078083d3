"""``GlobalRouting``: one API name answered by the nearest healthy region
(``modelfleet:aws:GlobalRouting``).

Per region, a Route53 health check probes ``https://<region>.api.<domain>/health`` and a
latency record for ``api.<domain>`` points at that region's name, guarded by the check: when a
region fails its check, Route53 stops answering with it and clients go to the other region (which
is sized for the whole peak). Region stacks create ``<region>.api.<domain>`` themselves, pointing
at their NLB; until they exist the checks fail, and Route53 answers with every region (its rule
when all records are unhealthy).
"""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

from components.outputs import known_after


@dataclass
class GlobalRoutingArgs:
    """``domain`` is the hosted zone; ``zone_id`` an existing zone (else it is created).
    Health checks every ``interval_s`` seconds (10 or 30), unhealthy after ``failures`` misses."""

    domain: str
    regions: list[str]
    zone_id: str | None = None
    health_path: str = "/health"
    interval_s: int = 10
    failures: int = 3
    ttl_s: int = 60


class GlobalRouting(pulumi.ComponentResource):
    """Hosted zone (or the given one), a health check and a latency record per region."""

    zone_id: pulumi.Output[str]
    api_hostname: pulumi.Output[str]
    region_hostnames: pulumi.Output[dict[str, str]]
    health_check_ids: pulumi.Output[dict[str, str]]
    name_servers: pulumi.Output[list[str]]

    def __init__(self, name: str, args: GlobalRoutingArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        if len(args.regions) < 2 or len(set(args.regions)) != len(args.regions):
            raise ValueError(f"regions {args.regions}: need at least two, each once, to survive one's loss")
        if args.interval_s not in (10, 30):
            raise ValueError("Route53 health checks run every 10 or 30 seconds")
        if not args.health_path.startswith("/"):
            raise ValueError(f"health path {args.health_path!r} must start with /")
        super().__init__("modelfleet:aws:GlobalRouting", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        api = f"api.{args.domain}"
        if args.zone_id:
            zone_id: pulumi.Output[str] = pulumi.Output.from_input(args.zone_id)
            self.name_servers = pulumi.Output.from_input([])
        else:
            zone = aws.route53.Zone(f"{name}-zone", name=args.domain, opts=child)
            zone_id, self.name_servers = zone.zone_id, zone.name_servers.apply(list)
        checks, hosts = {}, {}
        for region in args.regions:
            host = f"{region}.{api}"
            check = aws.route53.HealthCheck(
                f"{name}-{region}", type="HTTPS", fqdn=host, port=443, resource_path=args.health_path,
                request_interval=args.interval_s, failure_threshold=args.failures, measure_latency=True,
                tags={"Name": f"modelfleet {region}"}, opts=child)
            record = aws.route53.Record(
                f"{name}-{region}", zone_id=zone_id, name=api, type="CNAME", ttl=args.ttl_s, records=[host],
                set_identifier=region, latency_routing_policies=[{"region": region}],
                health_check_id=check.id, opts=child)
            checks[region] = check.id
            hosts[region] = known_after(record, host)
        self.zone_id = zone_id
        self.api_hostname = pulumi.Output.from_input(api)
        self.region_hostnames = pulumi.Output.all(**hosts).apply(dict)
        self.health_check_ids = pulumi.Output.all(**checks).apply(dict)
        self.register_outputs({"zone_id": self.zone_id, "api_hostname": self.api_hostname,
                               "region_hostnames": self.region_hostnames,
                               "health_check_ids": self.health_check_ids, "name_servers": self.name_servers})
