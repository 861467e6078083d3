"""``WeightsBucket``: one region's copy of the model weights (``modelfleet:aws:WeightsBucket``).

Versioned (S3 replication requires it on both ends, and a version's files never change once
registered), encrypted, closed to the public. The primary region's bucket carries the
``BucketReplicationConfig`` that copies every new object to each other region's bucket (one rule
per destination, delete markers replicated so a retired version disappears everywhere). Pass the
component an ``aws.Provider`` for its region (``opts.providers``); children inherit it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pulumi
import pulumi_aws as aws

from components.aws.iam import allow, policy, trust


@dataclass
class ReplicaTarget:
    """A destination bucket: its region, ARN, and its versioning resource (replication waits
    for it)."""

    region: str
    bucket_arn: pulumi.Input[str]
    versioning: pulumi.Resource


@dataclass
class WeightsBucketArgs:
    """``bucket`` in ``region``; a primary lists the buckets it replicates to."""

    bucket: str
    region: str
    replicate_to: list[ReplicaTarget] = field(default_factory=list)
    noncurrent_days: int = 30
    """Days an overwritten or deleted object's old version is kept."""


class WeightsBucket(pulumi.ComponentResource):
    """A versioned weights bucket, and replication out of it when it is the primary."""

    bucket_name: pulumi.Output[str]
    bucket_arn: pulumi.Output[str]
    region: pulumi.Output[str]
    replicated_to: pulumi.Output[list[str]]
    versioning: aws.s3.BucketVersioning

    def __init__(self, name: str, args: WeightsBucketArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        if not 3 <= len(args.bucket) <= 63 or args.bucket != args.bucket.lower():
            raise ValueError(f"{args.bucket!r} is not a valid S3 bucket name")
        regions = [t.region for t in args.replicate_to]
        if args.region in regions or len(set(regions)) != len(regions):
            raise ValueError(f"replication targets {regions} must be other regions, each once")
        super().__init__("modelfleet:aws:WeightsBucket", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        bucket = aws.s3.Bucket(name, bucket=args.bucket, force_destroy=False,
                               tags={"modelfleet.io/role": "weights"}, opts=child)
        self.versioning = aws.s3.BucketVersioning(
            name, bucket=bucket.id, versioning_configuration={"status": "Enabled"}, opts=child)
        aws.s3.BucketServerSideEncryptionConfiguration(
            name, bucket=bucket.id,
            rules=[{"apply_server_side_encryption_by_default": {"sse_algorithm": "AES256"},
                    "bucket_key_enabled": True}], opts=child)
        aws.s3.BucketPublicAccessBlock(name, bucket=bucket.id, block_public_acls=True, block_public_policy=True,
                                       ignore_public_acls=True, restrict_public_buckets=True, opts=child)
        aws.s3.BucketLifecycleConfiguration(
            name, bucket=bucket.id, rules=[{
                "id": "expire-noncurrent", "status": "Enabled", "filter": {},
                "noncurrent_version_expiration": {"noncurrent_days": args.noncurrent_days}}],
            opts=pulumi.ResourceOptions(parent=self, depends_on=[self.versioning]))
        if args.replicate_to:
            self._replicate(name, bucket, args)
        self.bucket_name = bucket.bucket
        self.bucket_arn = bucket.arn
        self.region = pulumi.Output.from_input(args.region)
        self.replicated_to = pulumi.Output.from_input(regions)
        self.register_outputs({"bucket_name": self.bucket_name, "bucket_arn": self.bucket_arn,
                               "region": self.region, "replicated_to": self.replicated_to})

    def _replicate(self, name: str, bucket: aws.s3.Bucket, args: WeightsBucketArgs) -> None:
        child = pulumi.ResourceOptions(parent=self)
        role = aws.iam.Role(f"{name}-replication", assume_role_policy=trust("s3.amazonaws.com"), opts=child)
        dests = [t.bucket_arn for t in args.replicate_to]
        doc = pulumi.Output.all(bucket.arn, *dests).apply(lambda arns: policy(
            allow(["s3:GetReplicationConfiguration", "s3:ListBucket"], [arns[0]]),
            allow(["s3:GetObjectVersionForReplication", "s3:GetObjectVersionAcl", "s3:GetObjectVersionTagging"],
                  [f"{arns[0]}/*"]),
            allow(["s3:ReplicateObject", "s3:ReplicateDelete", "s3:ReplicateTags"], [f"{a}/*" for a in arns[1:]])))
        role_policy = aws.iam.RolePolicy(f"{name}-replication", role=role.id, policy=doc, opts=child)
        rules = [aws.s3.BucketReplicationConfigRuleArgs(
            id=f"to-{t.region}", priority=i + 1, status="Enabled",
            filter=aws.s3.BucketReplicationConfigRuleFilterArgs(),
            delete_marker_replication=aws.s3.BucketReplicationConfigRuleDeleteMarkerReplicationArgs(status="Enabled"),
            destination=aws.s3.BucketReplicationConfigRuleDestinationArgs(bucket=t.bucket_arn, storage_class="STANDARD"))
            for i, t in enumerate(args.replicate_to)]
        aws.s3.BucketReplicationConfig(
            f"{name}-replication", bucket=bucket.id, role=role.arn, rules=rules,
            opts=pulumi.ResourceOptions(parent=self, depends_on=[self.versioning, role_policy,
                                                                  *[t.versioning for t in args.replicate_to]]))
