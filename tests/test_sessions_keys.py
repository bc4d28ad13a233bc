"""Session keys: format, tenant isolation, and an even spread of CRC32 buckets."""

from __future__ import annotations

import random
import uuid
import zlib

import pytest

from gateway.sessions.keys import KeyScheme


def test_key_format_has_the_shard_tag_then_tenant_then_id() -> None:
    scheme = KeyScheme()
    key = scheme.key("acme", "9f2c-abc")
    bucket = zlib.crc32(b"9f2c-abc") % 32
    assert key.bucket == bucket
    assert key.redis_key == f"chat:session:{{shard_{bucket:02d}}}:acme:9f2c-abc"
    assert scheme.outbox_key(bucket) == f"chat:session:{{shard_{bucket:02d}}}:outbox"


def test_buckets_are_zero_padded_to_two_digits_or_more() -> None:
    assert KeyScheme(buckets=32).shard_tag(7) == "{shard_07}"
    assert KeyScheme(buckets=4).shard_tag(3) == "{shard_03}"
    assert KeyScheme(buckets=1024).shard_tag(7) == "{shard_0007}"
    assert KeyScheme(prefix="support:", buckets=100).shard_tag(99) == "{shard_99}"


def test_tenants_never_share_a_key_and_bucket_ignores_the_tenant() -> None:
    scheme = KeyScheme()
    a, b = scheme.key("acme", "same-id"), scheme.key("globex", "same-id")
    assert a.redis_key != b.redis_key
    assert a.bucket == b.bucket


@pytest.mark.parametrize("tenant", ["", "a:b", "{x}", "a b", "t" * 65])
def test_tenant_ids_that_could_forge_a_key_are_refused(tenant: str) -> None:
    with pytest.raises(ValueError, match="tenant"):
        KeyScheme().key(tenant, "s")


@pytest.mark.parametrize("buckets", [32, 256])
def test_100k_ids_spread_uniformly_over_the_buckets(buckets: int) -> None:
    """Chi-square goodness of fit against the uniform distribution.

    For k-1 degrees of freedom the statistic has mean k-1 and standard
    deviation sqrt(2(k-1)); the bound is mean + 5 sd, far beyond chance. Ids
    are UUIDs (as clients make them) and sequential ids, both seeded.
    """
    scheme = KeyScheme(buckets=buckets)
    rng = random.Random(4)
    for ids in ([str(uuid.UUID(int=rng.getrandbits(128))) for _ in range(100_000)],
                [f"user-{i}" for i in range(100_000)]):
        counts = [0] * buckets
        for session_id in ids:
            counts[scheme.bucket(session_id)] += 1
        expected = len(ids) / buckets
        chi2 = sum((c - expected) ** 2 / expected for c in counts)
        dof = buckets - 1
        assert chi2 < dof + 5 * (2 * dof) ** 0.5, (chi2, min(counts), max(counts))
        # and no single bucket is off by more than 5 standard deviations of a count
        assert max(abs(c - expected) for c in counts) < 5 * expected ** 0.5
