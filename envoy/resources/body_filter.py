"""The ``json_to_metadata`` filter of a listener without the gateway: the body's ``model`` into
dynamic metadata, for the body routes of ``envoy_control.resources.body_routes``."""

from __future__ import annotations

from google.protobuf import any_pb2, struct_pb2

from envoy.extensions.filters.http.json_to_metadata.v3 import json_to_metadata_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from envoy.type.matcher.v3 import regex_pb2

REQUEST_METADATA = "modelfleet.request"
"""Dynamic-metadata namespace written by ``json_to_metadata`` (key ``model``)."""
MODEL_MISSING = "__modelfleet_model_missing__"
"""Metadata value when the JSON body has no ``model`` field."""
BODY_INVALID = "__modelfleet_body_invalid__"
"""Metadata value when the body is not JSON (or has a non-JSON content type)."""
JSON_CONTENT_TYPE = r"(?i)application/json *(;.*)?"


def make_body_model_filter() -> hcm_pb2.HttpFilter:
    """``json_to_metadata``: the body's ``model`` field into ``modelfleet.request:model``."""

    def pair(value: str | None) -> json_to_metadata_pb2.JsonToMetadata.KeyValuePair:
        kv = json_to_metadata_pb2.JsonToMetadata.KeyValuePair(
            metadata_namespace=REQUEST_METADATA, key="model"
        )
        if value is None:
            kv.type = json_to_metadata_pb2.JsonToMetadata.STRING
        else:
            kv.value.CopyFrom(struct_pb2.Value(string_value=value))
        return kv

    rule = json_to_metadata_pb2.JsonToMetadata.Rule(
        selectors=[json_to_metadata_pb2.JsonToMetadata.Selector(key="model")],
        on_present=pair(None),
        on_missing=pair(MODEL_MISSING),
        on_error=pair(BODY_INVALID),
    )
    config = json_to_metadata_pb2.JsonToMetadata(
        request_rules=json_to_metadata_pb2.JsonToMetadata.MatchRules(
            rules=[rule],
            allow_empty_content_type=True,
            allow_content_types_regex=regex_pb2.RegexMatcher(regex=JSON_CONTENT_TYPE),
        )
    )
    packed = any_pb2.Any()
    packed.Pack(config)
    return hcm_pb2.HttpFilter(name="envoy.filters.http.json_to_metadata", typed_config=packed)
