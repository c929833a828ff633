"""One random seed per test run (HINAMOE_TEST_SEED to replay), and each
test's seed derived from it and the test id."""

from __future__ import annotations

import os
import secrets
import zlib


def _base_seed() -> int:
    env = os.environ.get("HINAMOE_TEST_SEED")
    if env:
        return int(env, 0)
    return secrets.randbits(32)


BASE_SEED = _base_seed()


def seed_for(nodeid: str) -> int:
    return (BASE_SEED ^ zlib.crc32(nodeid.encode())) & 0xFFFFFFFF
