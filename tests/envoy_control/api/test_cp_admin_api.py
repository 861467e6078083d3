"""The admin API over a control plane with its registry in a real Postgres: the admin
credential, immutable versions (409), refused changes (422), the override layer's precedence
over the config directory, and restarts that resume it.

Postgres is the machine's (``MODELFLEET_TEST_POSTGRES_URL`` overrides the default); when it is
missing the test fails under ``CI=true`` and skips otherwise. Each test has its own table
prefix and drops its tables.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from envoy_control.api.http import create_app
from envoy_control.registry.store import Registry
from envoy_control.resources.build import ListenerSpec
from envoy_control.state.plane import ControlPlane
from envoy_control.xds.cache import SnapshotCache
from envoy_control.xds.snapshot import CLUSTER
from fastapi.testclient import TestClient

from modelfleet.config import ConfigError, load_config

CONFIG_DIR = Path(__file__).resolve().parents[3] / "config"
TOKEN = "admin-token-for-tests-0123456789"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def config_dir(tmp_path: Path) -> Path:
    return Path(shutil.copytree(CONFIG_DIR, tmp_path / "config"))


def make_plane(config_dir: Path, registry: Registry) -> ControlPlane:
    plane = ControlPlane(config_dir, SnapshotCache(), ListenerSpec("127.0.0.1", 18080),
                         store=registry)
    plane.load()
    return plane


@pytest.fixture
def plane(config_dir: Path, registry: Registry) -> ControlPlane:
    return make_plane(config_dir, registry)


@pytest.fixture
def client(plane: ControlPlane, registry: Registry) -> TestClient:
    return TestClient(create_app(plane, admin_token=TOKEN, registry=registry))


def version_body(version: str = "v15", **changes: Any) -> dict[str, Any]:
    """chat-7b@v14's record as a new version (new weights hash)."""
    record = load_config(CONFIG_DIR).config.version("chat-7b", "v14")
    assert record is not None
    body = record.model_dump(mode="json", exclude={"model", "status"})
    return {**body, "version": version, "weights_uri": f"s3://modelfleet-weights/chat-7b/{version}/",
            "weights_hash": "sha256:" + "ab" * 32, **changes}


def test_admin_endpoints_need_the_admin_token_and_refuse_team_keys(client: TestClient,
                                                                   plane: ControlPlane) -> None:
    dev_key = plane.config.local.dev_keys["search"]
    none = client.get("/admin/desired")
    assert none.status_code == 401 and none.headers["www-authenticate"] == "Bearer"
    team = client.put("/admin/models/chat-7b/alias", json={"version": "v14"},
                      headers={"Authorization": f"Bearer {dev_key}"})
    assert team.status_code == 403 and "team key" in team.json()["detail"]
    assert client.get("/admin/pools/chat-7b/state",
                      headers={"Authorization": f"Bearer {dev_key}"}).status_code == 403
    assert client.get("/admin/desired", headers={"Authorization": "Bearer x" * 4}).status_code == 401
    assert client.get("/admin/desired", headers={"Authorization": f"Basic {TOKEN}"}).status_code == 401
    assert client.get("/admin/pools/chat-7b/state", headers=ADMIN).status_code == 200
    assert plane.config.model("chat-7b").live == "v13"  # type: ignore[union-attr]
    spec = client.get("/openapi.json").json()
    assert "AdminToken" in spec["components"]["securitySchemes"]
    assert {"/admin/models/{model}/versions", "/admin/models/{model}/rollout",
            "/admin/models/{model}/alias", "/admin/teams/{team}/limits",
            "/admin/pools/{model}/state", "/admin/desired"} <= set(spec["paths"])


def test_without_a_credential_admin_reads_stay_open_and_changes_are_refused(
        plane: ControlPlane) -> None:
    open_client = TestClient(create_app(plane))
    assert open_client.get("/admin/pools/chat-7b/state").status_code == 200
    r = open_client.put("/admin/models/chat-7b/alias", json={"version": "v14"})
    assert r.status_code == 403 and "no admin" in r.json()["detail"]


def test_versions_are_immutable(client: TestClient, plane: ControlPlane, registry: Registry) -> None:
    first = client.post("/admin/models/chat-7b/versions", json=version_body(), headers=ADMIN)
    assert first.status_code == 201, first.text
    assert first.json()["created"] and first.json()["status"] == "registered"
    assert "chat-7b@v15" in plane.snapshot.names(CLUSTER)  # served at once, no traffic yet
    again = client.post("/admin/models/chat-7b/versions", json=version_body(), headers=ADMIN)
    assert again.status_code == 200 and not again.json()["created"]
    assert again.json()["record_hash"] == first.json()["record_hash"]

    changed = version_body(tokenizer_hash="sha256:" + "cd" * 32, precision="int8")
    refused = client.post("/admin/models/chat-7b/versions", json=changed, headers=ADMIN)
    assert refused.status_code == 409
    fields = {d["field"] for d in refused.json()["detail"]["differences"]}
    assert fields == {"tokenizer_hash", "precision"}
    assert "never changes" in refused.json()["detail"]["message"]

    declared = version_body("v13")  # the config's v13 with another weights hash
    assert client.post("/admin/models/chat-7b/versions", json=declared, headers=ADMIN).status_code == 409
    row = registry.version("chat-7b", "v15")
    assert row is not None and row["weights_hash"] == "sha256:" + "ab" * 32
    assert row["registered_by"] == "admin:admin" and registry.version("chat-7b", "v13") is not None


def test_invalid_changes_get_422_with_reasons(client: TestClient, plane: ControlPlane) -> None:
    before = plane.snapshot.version

    def problems(r: Any) -> list[str]:
        assert r.status_code == 422, r.text
        return [p["message"] for p in r.json()["detail"]["problems"]]

    bad_canary = {"version": "v99", "stage": "canary", "percent": 10}
    assert "chat-7b@v99 is not a declared version" in problems(
        client.put("/admin/models/chat-7b/rollout", json=bad_canary, headers=ADMIN))
    assert any("v98" in m for m in problems(
        client.put("/admin/models/chat-7b/alias", json={"version": "v98"}, headers=ADMIN)))
    share = {"model": "chat-7b", "tokens_per_minute": 10, "max_concurrency": 1,
             "guaranteed_share": 0.9}
    assert any("sum to 1.30, more than 1" in m for m in problems(
        client.put("/admin/teams/search/limits", json=share, headers=ADMIN)))
    fp16 = version_body("v2", precision="fp16", gpus_per_replica=2,
                        architecture={"params_billion": 70, "layers": 80, "attention_heads": 64,
                                      "kv_heads": 8, "head_dim": 128},
                        capacity={"output_tokens_per_s": 400, "tokens_in_flight": 40000, "streams": 20})
    r = client.post("/admin/models/reason-70b/versions", json=fp16, headers=ADMIN)
    found = problems(r)
    assert any("less than 25%" in m for m in found)
    assert r.json()["detail"]["problems"][0]["path"].startswith("versions[reason-70b@v2]")
    assert client.put("/admin/models/chat-7b/rollout", headers=ADMIN,
                      json={"version": "v14", "stage": "canary", "percent": 150}).status_code == 422
    assert client.put("/admin/models/gpt-9/alias", json={"version": "v1"}, headers=ADMIN).status_code == 404
    assert client.put("/admin/teams/nobody/limits", json=share, headers=ADMIN).status_code == 404
    assert plane.snapshot.version == before


def test_changes_reach_the_router_state_and_the_registry(client: TestClient, plane: ControlPlane,
                                                         registry: Registry) -> None:
    r = client.put("/admin/models/chat-7b/rollout", headers=ADMIN,
                   json={"version": "v14", "stage": "canary", "percent": 25}).json()
    assert r["canary"] == {"version": "v14", "percent": 25.0} and r["live"] == "v13"
    alias = plane.router.current.alias("chat-7b")  # type: ignore[union-attr]
    assert alias is not None and alias.canary_percent == 25.0
    promoted = client.put("/admin/models/chat-7b/alias", json={"version": "v14"}, headers=ADMIN).json()
    assert promoted["live"] == "v14" and promoted["canary"] is None
    alias = plane.router.current.alias("chat-7b")  # type: ignore[union-attr]
    assert alias is not None and (alias.live, alias.canary) == ("v14", None)
    models = {row["model"]: row for row in registry.rows("models")}
    assert models["chat-7b"]["live_version"] == "v14" and models["chat-7b"]["canary_version"] is None

    limit = {"model": "chat-7b", "tokens_per_minute": 8_000_000, "max_concurrency": 600,
             "guaranteed_share": 0.5}
    out = client.put("/admin/teams/search/limits", json=limit, headers=ADMIN).json()
    assert out["limit"]["tiers"] == ["interactive", "standard"]  # kept from the config
    limits = {(x["team"], x["model"]): x for x in registry.rows("team_limits")}
    assert limits[("search", "chat-7b")]["tokens_per_minute"] == 8_000_000
    desired = client.get("/admin/desired", headers=ADMIN).json()
    assert desired["routes"]["chat-7b"]["live"] == "v14"
    assert {(o["kind"], o["target"]) for o in desired["overrides"]} == {
        ("live", "chat-7b"), ("canary", "chat-7b"), ("limit", "search/chat-7b")}


def test_overrides_hold_until_the_config_acknowledges_or_changes_them(
        client: TestClient, plane: ControlPlane, config_dir: Path, registry: Registry) -> None:
    client.put("/admin/models/chat-7b/rollout", headers=ADMIN,
               json={"version": "v14", "stage": "canary", "percent": 0})  # a rollback
    client.put("/admin/models/reason-70b/rollout", headers=ADMIN,
               json={"version": "v1", "stage": "shadow", "percent": 5})  # refused: v1 is live
    assert plane.config.model("chat-7b").canary is None  # type: ignore[union-attr]
    pools = config_dir / "pools.yaml"
    pools.write_text(pools.read_text().replace("min_replicas: 6", "min_replicas: 7"))
    plane.reload()  # an unrelated config change: the rollback holds
    assert plane.config.model("chat-7b").canary is None  # type: ignore[union-attr]

    restarted = make_plane(config_dir, registry)  # a restart resumes it from the registry
    assert restarted.config.model("chat-7b").canary is None  # type: ignore[union-attr]

    models = config_dir / "models.yaml"
    models.write_text(models.read_text().replace("percent: 10 ", "percent: 20 "))
    plane.reload()  # the config changed that field: the reviewed change wins
    assert plane.config.model("chat-7b").canary.percent == 20  # type: ignore[union-attr]
    assert plane.desired.overrides == ()

    client.put("/admin/models/chat-7b/rollout", headers=ADMIN,
               json={"version": "v14", "stage": "canary", "percent": 5})
    models.write_text(models.read_text().replace("percent: 20 ", "percent: 5 "))
    plane.reload()  # the config acknowledges it
    assert plane.desired.overrides == () and plane.config.model("chat-7b").canary.percent == 5  # type: ignore[union-attr]


def test_a_config_that_changes_a_registered_version_is_refused(
        plane: ControlPlane, config_dir: Path) -> None:
    models = config_dir / "models.yaml"
    text = models.read_text()
    models.write_text(text.replace("s3://modelfleet-weights/chat-7b/v13/", "s3://elsewhere/v13/"))
    with pytest.raises(ConfigError) as err:
        plane.reload()
    assert "chat-7b@v13 is registered with weights_uri" in str(err.value)
    assert err.value.problems[0].location.path == "versions[0].weights_uri"
    assert plane.config.version("chat-7b", "v13").weights_uri.endswith("/chat-7b/v13/")  # type: ignore[union-attr]
