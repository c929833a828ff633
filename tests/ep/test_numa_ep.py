"""NUMA partitioning through the EP: simulated 2/4/8-node topologies give the
reference result (every tier; the AMX bf16 block path on the tile emulator
with rows that pages split mid-row), this machine's topology is read from
sysfs, and a run under `numactl --interleave=all` is correct."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import hinamoe
from hinamoe.models import MoEConfig, build_moe_model, random_input, random_logits, run_moe

from support.moe_cases import ACT_FUSION_IDS, ACT_FUSIONS, DTYPES, check_ep_against_reference, random_config
from support.moe_reference import check_close, reference_for
from support.runtime import require_isa
from support.sessions import error_text, hina_session


@pytest.mark.parametrize("nodes", [2, 4, 8])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("isa", ["ref", "avx2", "avx512", "amx-emu"])
def test_fake_topologies_match_reference(nodes, dtype, isa, rng, seed):
    require_isa(isa)
    act, fusion = ACT_FUSIONS[int(rng.integers(len(ACT_FUSIONS)))]
    cfg = random_config(rng, act, fusion, dtype, weights_as_inputs=False)
    model, w = build_moe_model(cfg, rng=rng)
    sess = hina_session(model, isa=isa, threads=2, extra_options={"numa": f"fake:{nodes}"})
    for t in (1, int(rng.integers(2, 40))):
        x, lg = random_input(cfg, t, rng), random_logits(cfg, t, rng)
        check_close(run_moe(sess, x, lg), reference_for(cfg, x, lg, w), dtype,
                    f"seed {seed} numa=fake:{nodes} isa={isa} T={t} [{cfg.describe()}]")


@pytest.mark.parametrize("nodes", [2, 4, 8])
@pytest.mark.parametrize("act,fusion", ACT_FUSIONS, ids=ACT_FUSION_IDS)
def test_amx_emu_bf16_partitioned_matches_reference(nodes, act, fusion, rng, seed):
    """isa=amx-emu, bf16: the AMX block path split by node (paper Algorithm 2,
    on the tile emulator). Rows of 2*hidden or 2*inter bytes are not whole
    4 KiB pages, so page boundaries (segment ends) fall mid-row and, with the
    initializers' arbitrary alignment, off the 32-element k-blocks; up to 40
    tokens give experts more than one 32-token block."""
    require_isa("amx-emu")
    e = int(rng.choice([2, 3, 4, 8]))
    cfg = random_config(rng, act, fusion, "bfloat16", hidden=int(rng.choice([520, 1000, 1536])),
                        inter=int(rng.choice([40, 72, 150])), experts=e, k=int(rng.integers(1, e + 1)))
    check_ep_against_reference(cfg, "amx-emu", rng, [1, int(rng.integers(2, 41))], threads=2,
                               what=f"seed {seed} numa=fake:{nodes}", extra_options={"numa": f"fake:{nodes}"})


def test_this_machine_topology():
    assert hinamoe.numa_nodes("auto") >= 1
    assert hinamoe.numa_nodes("off") == 1
    assert hinamoe.numa_nodes("fake:4") == 4
    with pytest.raises(ValueError, match="fake"):
        hinamoe.numa_nodes("fake:3")


def test_unknown_numa_option_fails_session_creation():
    model, _ = build_moe_model(MoEConfig(hidden=16, inter=8, experts=2, k=1), seed=0)
    with pytest.raises(Exception) as info:
        hina_session(model, extra_options={"numa": "fake:5"})
    assert "numa" in error_text(info.value) and "fake:5" in error_text(info.value)


@pytest.mark.skipif(shutil.which("numactl") is None, reason="numactl is not installed")
def test_run_under_numactl_interleave(tmp_path, seed):
    """The weights are page-interleaved by numactl; the EP reads the real
    topology (one node here) and gives the reference result."""
    script = tmp_path / "run.py"
    script.write_text(textwrap.dedent("""
        import sys
        import numpy as np
        import onnxruntime as ort
        import hinamoe
        sys.path.insert(0, sys.argv[1])
        from hinamoe.models import MoEConfig, build_moe_model, random_input, random_logits, run_moe
        from support.moe_reference import check_close, reference_for
        rng = np.random.default_rng(int(sys.argv[2]))
        cfg = MoEConfig(hidden=200, inter=136, experts=8, k=2, activation="swiglu", swiglu_fusion=1)
        model, w = build_moe_model(cfg, rng=rng)
        so = ort.SessionOptions()
        so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
        sess = ort.InferenceSession(model.SerializeToString(), so,
                                    providers=[("HinaMoE", {"numa": "auto"})])
        assert sess.get_providers()[0] == "HinaMoE"
        x, lg = random_input(cfg, 9, rng), random_logits(cfg, 9, rng)
        check_close(run_moe(sess, x, lg), reference_for(cfg, x, lg, w), cfg.dtype, "numactl")
        print("nodes", hinamoe.numa_nodes("auto"))
    """))
    from support import TESTS_DIR

    tests_dir = str(TESTS_DIR)
    proc = subprocess.run(["numactl", "--interleave=all", sys.executable, str(script), tests_dir, str(seed)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    nodes = int(proc.stdout.split("nodes")[-1])
    assert nodes == hinamoe.numa_nodes("auto") >= 1
