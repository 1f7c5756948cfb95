"""What a rank keeps of its instances' set-up: one budget per process, shared by the caches, set from the node."""

import pytest

from deepfusion.configuration.config import load_config
from deepfusion.configuration.schema import ConfigError
from deepfusion.parallel.runtime import cache_budget
from diffnet.backend import budget

GIB = 2**30


def test_the_budget_is_a_third_of_the_node_shared_by_its_ranks_unless_given():
    node = int(23.5 * GIB)
    assert cache_budget(0.0, node, 1) == node // 3  # one rank: 7.8 GiB
    assert cache_budget(0.0, node, 2) == node // 6  # two ranks on the node: 3.9 GiB each, not 12 each
    assert cache_budget(0.0, 1024 * GIB, 4) == budget.DEFAULT_BYTES  # a large node: the default, no more
    assert cache_budget(0.0, None, 2) == budget.DEFAULT_BYTES  # a system that does not say
    assert cache_budget(1.5, node, 2) == int(1.5 * GIB)  # parallel.cache_gib
    assert load_config(None, ["parallel.cache_gib=2.5"]).parallel.cache_gib == 2.5
    with pytest.raises(ConfigError, match="parallel.cache_gib"):
        load_config(None, ["parallel.cache_gib=-1"])


def test_each_cache_reads_its_share_of_the_budget_when_it_keeps(monkeypatch):
    assert abs(sum(budget.SHARES.values()) - 1.0) < 1e-12
    monkeypatch.setattr(budget, "_BUDGET", [budget.DEFAULT_BYTES])
    assert budget.cache_bytes("coarse spaces") == 4 * GIB and budget.cache_bytes("discretisations") == 2 * GIB
    budget.set_budget_bytes(3 * GIB)
    assert budget.budget_bytes() == 3 * GIB and budget.cache_bytes("multigrids") == GIB
    with pytest.raises(ValueError, match="must be > 0"):
        budget.set_budget_bytes(0)
