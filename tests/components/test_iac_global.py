"""GlobalRouting (health checks and latency records per region) and WeightsBucket replication."""

from __future__ import annotations

import pulumi
import pulumi_aws as aws
import pytest

from components.aws.global_routing import GlobalRouting, GlobalRoutingArgs
from components.aws.weights_bucket import ReplicaTarget, WeightsBucket, WeightsBucketArgs
from components.testing import Build, inputs

REGIONS = ["us-east-1", "eu-west-1"]


def test_latency_records_with_health_checks_for_both_regions(build: Build) -> None:
    mocks = build(lambda: GlobalRouting("routing", GlobalRoutingArgs("modelfleet.example.com", REGIONS)))
    checks = {c["fqdn"]: c for c in inputs(mocks, "aws:route53/healthCheck:HealthCheck")}
    assert set(checks) == {"us-east-1.api.modelfleet.example.com", "eu-west-1.api.modelfleet.example.com"}
    for c in checks.values():
        assert (c["type"], c["port"], c["resourcePath"]) == ("HTTPS", 443, "/health")
        assert (c["requestInterval"], c["failureThreshold"]) == (10, 3)
    records = {r["setIdentifier"]: r for r in inputs(mocks, "aws:route53/record:Record")}
    assert set(records) == set(REGIONS)
    for region, r in records.items():
        assert r["name"] == "api.modelfleet.example.com" and r["type"] == "CNAME"
        assert r["latencyRoutingPolicies"] == [{"region": region}]
        assert r["records"] == [f"{region}.api.modelfleet.example.com"]
        assert r["healthCheckId"] == f"routing-{region}-id"  # each record guarded by its region's check
        assert r["zoneId"] == "ZMOCKZONE"
    assert len(inputs(mocks, "aws:route53/zone:Zone")) == 1


def test_an_existing_zone_is_used_as_is(build: Build) -> None:
    mocks = build(lambda: GlobalRouting("routing", GlobalRoutingArgs("m.example.com", REGIONS, zone_id="Z123")))
    assert inputs(mocks, "aws:route53/zone:Zone") == []
    assert {r["zoneId"] for r in inputs(mocks, "aws:route53/record:Record")} == {"Z123"}


def test_one_region_cannot_fail_over(build: Build) -> None:
    with pytest.raises(ValueError, match="at least two"):
        build(lambda: GlobalRouting("routing", GlobalRoutingArgs("m.example.com", ["us-east-1"])))


def _buckets() -> None:
    eu = WeightsBucket("weights-eu", WeightsBucketArgs("modelfleet-weights-eu-west-1", "eu-west-1"),
                       opts=pulumi.ResourceOptions(providers=[aws.Provider("aws-eu", region="eu-west-1")]))
    WeightsBucket("weights-us", WeightsBucketArgs("modelfleet-weights", "us-east-1",
                                                  [ReplicaTarget("eu-west-1", eu.bucket_arn, eu.versioning)]))


def test_buckets_are_versioned_and_the_primary_replicates(build: Build) -> None:
    mocks = build(_buckets)
    assert {b["bucket"] for b in inputs(mocks, "aws:s3/bucket:Bucket")} == \
        {"modelfleet-weights", "modelfleet-weights-eu-west-1"}
    versioning = inputs(mocks, "aws:s3/bucketVersioning:BucketVersioning")
    assert [v["versioningConfiguration"]["status"] for v in versioning] == ["Enabled", "Enabled"]
    blocks = inputs(mocks, "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock")
    assert all(b["blockPublicAcls"] and b["restrictPublicBuckets"] for b in blocks)
    (repl,) = inputs(mocks, "aws:s3/bucketReplicationConfig:BucketReplicationConfig")
    assert repl["bucket"] == "weights-us-id"
    (rule,) = repl["rules"]
    assert rule["destination"]["bucket"] == "arn:aws:s3:::modelfleet-weights-eu-west-1"
    assert rule["status"] == "Enabled" and rule["deleteMarkerReplication"] == {"status": "Enabled"}
    (role,) = [r for r in inputs(mocks, "aws:iam/role:Role") if "s3.amazonaws.com" in r["assumeRolePolicy"]]
    assert role
    (policy,) = inputs(mocks, "aws:iam/rolePolicy:RolePolicy")
    assert "arn:aws:s3:::modelfleet-weights-eu-west-1/*" in policy["policy"]


def test_replicating_to_itself_is_refused(build: Build) -> None:
    def bad() -> None:
        b = WeightsBucket("w1", WeightsBucketArgs("modelfleet-weights-x", "us-east-1"))
        WeightsBucket("w2", WeightsBucketArgs("modelfleet-weights", "us-east-1",
                                              [ReplicaTarget("us-east-1", b.bucket_arn, b.versioning)]))

    with pytest.raises(ValueError, match="must be other regions"):
        build(bad)
