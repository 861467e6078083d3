"""The gateway's decision on one request, composed from the policy modules (synchronous; the only
I/O is the bucket store's). The FastAPI ext_authz service and the benchmark call this.

Order (first refusal wins; nothing later runs, and no token stays charged):

1. key -> team (401);
2. retry budget: an early retry past the team's budget is refused cheaply (429);
3. body and headers -> :class:`~gateway_ext.request.ChatRequest` (400/404/413);
4. the team may use the model and the tier (403);
5. token bucket: reserve prompt estimate + n x max_tokens (429 with Retry-After; 400 if larger than
   the whole bucket);
6. version: the explicit ``@vN``, else the ``choose_version`` callable (default: the live alias;
   conversation pinning and the canary split plug in here);
7. admission by tier on the version's pool (ADMIT / QUEUE, or 429/503, which refund the reservation).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from gateway_ext.limits.admission import PoolAdmission
from gateway_ext.limits.admission_types import (
    AdmissionDecision,
    AdmissionReason,
    AdmissionRequest,
    Outcome,
)
from gateway_ext.limits.bucket_store import (
    BucketKey,
    BucketStore,
    Settlement,
    SettleVerdict,
    reservation_ttl_s,
)
from gateway_ext.limits.buckets import Reservation, Verdict
from gateway_ext.limits.retry_budget import RetryBudget, fingerprint, retry_after_headers
from gateway_ext.metering.meter import UsageMeter
from gateway_ext.prompt_tokens import CachedChatMLEstimator, PromptTokenEstimator
from gateway_ext.request import DEFAULT_MAX_BODY_BYTES, ChatRequest, header, parse_chat_request
from modelfleet.config.keys import Authenticated, KeyRing, authorize
from modelfleet.config.schema import PlatformConfig, TeamLimit
from modelfleet.contract.errors import ApiError, invalid, rate_limited, shed
from modelfleet.contract.headers import (
    CONVERSATION_HEADER,
    RESERVATION_HEADER,
    ROUTE_VERSION_HEADER,
    TEAM_HEADER,
    TIER_HEADER,
)


@dataclass(frozen=True, slots=True)
class Admitted:
    """A request that holds a reservation and was admitted or queued (``outcome.decision``)."""

    request: ChatRequest
    team: str
    tokens_per_minute: int
    pool: str
    version: str
    reservation_id: str
    outcome: Outcome
    headers: dict[str, str]


@dataclass(frozen=True, slots=True)
class Charge:
    """A request past steps 1-4: its team's ``limit``, the bucket ``key``, the reservation's
    ``ttl_s`` (seconds) and id, and the retry fingerprint ``print_``."""

    request: ChatRequest
    team: str
    limit: TeamLimit
    key: BucketKey
    ttl_s: float
    print_: str
    reservation_id: str


@dataclass(frozen=True, slots=True)
class Refused:
    """A refusal; ``team`` and ``model`` when known."""

    error: ApiError
    team: str | None = None
    model: str | None = None


def live_version(config: PlatformConfig, request: ChatRequest) -> str:
    """The version ``request`` goes to without pinning or canary: explicit, else the live alias."""
    if request.version is not None:
        return request.version
    model = config.model(request.model)
    if model is None:
        raise ValueError(f"unknown model {request.model!r}")
    return model.live


class GatewayCore:
    """Decides on requests against ``config`` with a bucket ``store`` and one
    :class:`PoolAdmission` per ``model@version`` in ``pools``. Prompt tokens are estimated by
    ``estimators[model]``, else ``default_estimator`` (default: a new
    :class:`~gateway_ext.prompt_tokens.CachedChatMLEstimator`)."""

    def __init__(self, config: PlatformConfig, store: BucketStore,
                 pools: Mapping[str, PoolAdmission], retry: RetryBudget, meter: UsageMeter,
                 choose_version: Callable[[ChatRequest], str] | None = None,
                 max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
                 estimators: Mapping[str, PromptTokenEstimator] | None = None,
                 default_estimator: PromptTokenEstimator | None = None,
                 choose_team_version: Callable[[ChatRequest, str], str] | None = None) -> None:
        self.config = config
        self.choose_team_version = choose_team_version
        """Replaces ``choose_version`` when set: also told the team (pins per team)."""
        self.keys = KeyRing(config.teams)
        self.store = store
        self.pools = pools
        self.retry = retry
        self.meter = meter
        self.choose_version = choose_version or (lambda r: live_version(config, r))
        self.max_body_bytes = max_body_bytes
        self.estimators = estimators
        self.default_estimator = default_estimator or CachedChatMLEstimator()

    def use_config(self, config: PlatformConfig) -> None:
        """Decide on ``config`` from the next request on (team limits published by the control
        plane: :mod:`gateway_ext.limits.team_limits`); requests already admitted settle as they were."""
        self.config = config
        self.keys = KeyRing(config.teams)

    def decide(self, headers: Mapping[str, str], body: bytes, now: float,
               request_id: str) -> Admitted | Refused:
        """Decide on one request at ``now`` (seconds); ``request_id`` becomes the reservation id:
        :meth:`prepare`, the bucket reservation, :meth:`conclude` (a refusal refunds it)."""
        charge = self.prepare(headers, body, now, request_id)
        if isinstance(charge, Refused):
            return charge
        return self._reserve_and_conclude(charge, now)

    def charge(self, auth: Authenticated, req: ChatRequest, print_: str, now: float,
               request_id: str) -> Admitted | Refused:
        """Steps 4-7 at ``now`` (seconds) for a request already authenticated, past the retry
        check and parsed (the simulator's entry, :mod:`sim.fleet.gateway`): the team's limit, the
        bucket reservation, :meth:`conclude` (a refusal refunds the reservation)."""
        limit = authorize(auth.team, req.model, req.tier)
        if isinstance(limit, ApiError):
            return Refused(limit, auth.team.name, req.model)
        model = self.config.model(req.model)
        ttl = reservation_ttl_s(model.max_output_tokens if model else req.max_tokens)
        return self._reserve_and_conclude(Charge(req, auth.team.name, limit,
                                                 BucketKey(auth.team.name, req.model), ttl,
                                                 print_, request_id), now)

    def _reserve_and_conclude(self, charge: Charge, now: float) -> Admitted | Refused:
        rid = charge.reservation_id
        res = self.store.reserve(charge.key, charge.limit.tokens_per_minute,
                                 charge.request.reserve_tokens, rid, now, charge.ttl_s)
        result = self.conclude(charge, res, now)
        if isinstance(result, Refused) and res.verdict is Verdict.RESERVED:
            self.store.settle(charge.key, charge.limit.tokens_per_minute, rid, 0, now)
        return result

    def prepare(self, headers: Mapping[str, str], body: bytes, now: float,
                request_id: str) -> Charge | Refused:
        """Steps 1-4 at ``now`` (seconds), no I/O: the reservation to ask the bucket store for, or
        a refusal. The asyncio service awaits the store itself between this and :meth:`conclude`."""
        auth = self.keys.authenticate(header(headers, "authorization"))
        if isinstance(auth, ApiError):
            return Refused(auth)
        team = auth.team.name
        print_ = fingerprint(header(headers, CONVERSATION_HEADER), body)
        check = self.retry.check(team, print_, now)
        if not check.allowed:
            error = rate_limited("Too many retries before Retry-After: slow down.",
                                 code="retry_budget_exceeded")
            return Refused(error.with_headers(retry_after_headers(check.retry_after_s)), team)
        req = parse_chat_request(body, headers, self.config, max_body_bytes=self.max_body_bytes,
                                 estimators=self.estimators,
                                 default_estimator=self.default_estimator)
        if isinstance(req, ApiError):
            return Refused(req, team)
        limit = authorize(auth.team, req.model, req.tier)
        if isinstance(limit, ApiError):
            return Refused(limit, team, req.model)
        model = self.config.model(req.model)
        ttl = reservation_ttl_s(model.max_output_tokens if model else req.max_tokens)
        return Charge(req, team, limit, BucketKey(team, req.model), ttl, print_, request_id)

    def conclude(self, charge: Charge, res: Reservation, now: float,
                 max_concurrency: int | None = None,
                 version: str | None = None) -> Admitted | Refused:
        """Steps 5-7 at ``now`` (seconds) once the bucket answered ``res``. ``max_concurrency``
        replaces the team's limit in the pool's check (a count shared in Redis already decided:
        0 refuses, a huge number skips the local count). ``version``: step 6 already done by the
        caller (the awaited pin store), only for a RESERVED ``res``; else the chooser runs here.
        A refusal after a RESERVED ``res`` does not refund it: the caller settles the reservation
        with 0 tokens."""
        req, team, limit, print_ = charge.request, charge.team, charge.limit, charge.print_
        request_id = charge.reservation_id
        if res.verdict is Verdict.TOO_LARGE:
            return Refused(invalid(
                f"This request needs {req.reserve_tokens} tokens (prompt {req.prompt_tokens} + "
                f"{req.n} x max_tokens {req.max_tokens}); team '{team}' may use at most "
                f"{limit.tokens_per_minute} tokens per minute on '{req.model}'. Lower max_tokens.",
                param="max_tokens", code="exceeds_token_limit").with_headers(res.headers()),
                team, req.model)
        if res.verdict is Verdict.DENIED:
            self.meter.record_rejected(team, req.model, now, tier=req.tier)
            delay = self.retry.refused(team, print_, res.retry_after_s, now)
            error = rate_limited(f"Team '{team}' is over its limit of {limit.tokens_per_minute} "
                                 f"tokens per minute on '{req.model}'.")
            return Refused(error.with_headers({**res.headers(), **retry_after_headers(delay)}),
                           team, req.model)
        if version is None:
            version = (self.choose_version(req) if self.choose_team_version is None
                       else self.choose_team_version(req, team))
        pool_key = f"{req.model}@{version}"
        pool = self.pools.get(pool_key)
        outcome = None if pool is None else pool.offer(AdmissionRequest(
            request_id, team, req.tier, req.reserve_tokens,
            limit.max_concurrency if max_concurrency is None else max_concurrency,
            limit.guaranteed_share), now)
        if outcome is None or outcome.decision in (AdmissionDecision.REJECT_429, AdmissionDecision.SHED_503):
            return self._refuse_admission(team, req, version, outcome, print_, now)
        headers = {**res.headers(), ROUTE_VERSION_HEADER: pool_key, TEAM_HEADER: team,
                   TIER_HEADER: req.tier, RESERVATION_HEADER: request_id}
        return Admitted(req, team, limit.tokens_per_minute, pool_key, version, request_id,
                        outcome, headers)

    def _refuse_admission(self, team: str, req: ChatRequest, version: str, outcome: Outcome | None,
                          print_: str, now: float) -> Refused:
        if outcome is None:
            self.meter.record_shed(team, req.model, now, version, req.tier)
            error = shed(f"No pool serves '{req.model}@{version}' in this region.", code="no_pool")
            return Refused(error.with_headers(retry_after_headers(
                self.retry.refused(team, print_, 5.0, now))), team, req.model)
        delay = self.retry.refused(team, print_, outcome.retry_after_s, now)
        if outcome.decision is AdmissionDecision.REJECT_429:
            self.meter.record_rejected(team, req.model, now, version, req.tier)
            what = ("open requests (max_concurrency)" if outcome.reason is AdmissionReason.MAX_CONCURRENCY
                    else "guaranteed share of an overloaded pool")
            error = rate_limited(f"Team '{team}' is over its {what} on '{req.model}'.",
                                 code=str(outcome.reason))
        else:
            self.meter.record_shed(team, req.model, now, version, req.tier)
            error = shed(f"The '{req.model}' pool is overloaded; '{req.tier}' requests are "
                         f"being shed.")
        return Refused(error.with_headers(retry_after_headers(delay)), team, req.model)

    def finish(self, admitted: Admitted, prompt_tokens: int, cached_tokens: int,
               output_tokens: int, now: float) -> tuple[Settlement, list[Outcome]]:
        """A request ended at ``now`` (seconds) with its real usage (tokens): settle its
        reservation, meter it (once: not for a duplicate settle), free its pool slot; returns the settlement and the queued requests
        admitted in its place."""
        settlement = self.store.settle(BucketKey(admitted.team, admitted.request.model),
                                       admitted.tokens_per_minute, admitted.reservation_id,
                                       prompt_tokens + output_tokens, now)
        return settlement, self.complete(admitted, settlement, prompt_tokens, cached_tokens,
                                         output_tokens, now)

    def complete(self, admitted: Admitted, settlement: Settlement, prompt_tokens: int,
                 cached_tokens: int, output_tokens: int, now: float) -> list[Outcome]:
        """:meth:`finish` once the store answered ``settlement``: meter the usage (tokens;
        not for a duplicate settle), free the pool slot; returns the admissions made."""
        if settlement.verdict in (SettleVerdict.SETTLED, SettleVerdict.EXPIRED):
            self.meter.record_usage(admitted.team, admitted.request.model, admitted.version, now,
                                    prompt_tokens, cached_tokens, output_tokens,
                                    admitted.request.tier)
        return self.pools[admitted.pool].release(admitted.reservation_id, now)

    def abandon(self, admitted: Admitted, now: float, shed: bool) -> list[Outcome]:
        """A queued request left without running at ``now`` (seconds): its client went away, or
        it was shed or timed out (``shed``: metered as a 503). Refunds its whole reservation and
        frees its queue slot; returns the queued requests admitted in its place."""
        self.store.settle(BucketKey(admitted.team, admitted.request.model),
                          admitted.tokens_per_minute, admitted.reservation_id, 0, now)
        return self.dropped(admitted, now, shed)

    def dropped(self, admitted: Admitted, now: float, shed: bool) -> list[Outcome]:
        """:meth:`abandon` without the refund (the caller makes it): meter a shed (``shed``) and
        free the queue slot at ``now`` (seconds); returns the admissions made."""
        if shed:
            self.meter.record_shed(admitted.team, admitted.request.model, now, admitted.version,
                                   admitted.request.tier)
        return self.pools[admitted.pool].release(admitted.reservation_id, now)
