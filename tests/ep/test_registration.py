"""Registering the plugin EP library and choosing the ISA tier."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import textwrap

import pytest

import hinamoe
from hinamoe.models import MoEConfig, build_moe_model, random_input, random_logits, run_moe

from support import REPO_ROOT
from support.sessions import error_text, hina_session

TIERS = ("ref", "avx2", "avx512", "amx")


def _tiny_model():
    return build_moe_model(MoEConfig(hidden=16, inter=8, experts=2, k=1, activation="relu"),
                           seed=3)[0]


def _python(code: str, env_extra: dict | None = None, timeout: int = 120):
    env = dict(os.environ)
    env.pop("HINAMOE_ISA", None)
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, env=env, timeout=timeout, cwd=str(REPO_ROOT / "tests"))


def test_import_and_register_twice():
    hm = hinamoe
    hm2 = importlib.import_module("hinamoe")
    assert hm2 is hm
    hm.register()
    hm.register()
    assert hm.get_ep_name() == "HinaMoE"
    assert "HinaMoE" in hm.get_ep_names()
    assert os.path.isfile(hm.get_library_path())
    assert hm.best_tier() in TIERS


def test_fresh_process_import_twice_and_reload():
    r = _python("""
        import importlib, onnxruntime as ort
        import hinamoe
        import hinamoe as again
        hinamoe.register(); hinamoe.register()
        importlib.reload(hinamoe)
        hinamoe.register()
        names = [d.ep_name for d in ort.get_ep_devices()]
        print("devices", names.count("HinaMoE"))
    """)
    assert r.returncode == 0, r.stderr
    assert "devices" in r.stdout and int(r.stdout.split()[-1]) >= 1, r.stdout


def test_providers_first_is_hinamoe():
    import onnxruntime as ort

    model = _tiny_model().SerializeToString()
    for providers in (["HinaMoE"], ["HinaMoE", "CPUExecutionProvider"],
                      [("HinaMoE", {"isa": "auto"})]):
        sess = ort.InferenceSession(model, providers=providers)
        assert sess.get_providers()[0] == "HinaMoE", (providers, sess.get_providers())


@pytest.mark.parametrize("isa", ["auto", "ref"])
def test_isa_option_accepted(isa, rng):
    sess = hina_session(_tiny_model(), isa=isa)
    cfg = MoEConfig(hidden=16, inter=8, experts=2, k=1, activation="relu")
    out = run_moe(sess, random_input(cfg, 3, rng), random_logits(cfg, 3, rng))
    assert out.shape == (3, 16)


def test_unknown_isa_option_fails_clearly():
    """Session creation fails naming the bad value. (Without
    session.disable_cpu_ep_fallback, onnxruntime's Python wrapper prints the EP
    error and retries on the CPU EP alone: HinaMoE is then not in the session.)"""
    import onnxruntime as ort

    with pytest.raises(Exception) as ei:
        hina_session(_tiny_model(), isa="sse9000")
    msg = error_text(ei.value)
    assert "sse9000" in msg and "isa" in msg.lower(), msg
    so = ort.SessionOptions()
    so.log_severity_level = 4
    try:
        sess = ort.InferenceSession(_tiny_model().SerializeToString(), so,
                                    providers=[("HinaMoE", {"isa": "sse9000"})])
    except Exception:
        return
    assert "HinaMoE" not in sess.get_providers()


def test_amx_where_the_cpu_lacks_it_fails_clearly():
    """isa=amx on a CPU without AMX is an error at session creation that says
    which check failed; where AMX exists the session runs on it."""
    import hinamoe

    why = hinamoe.tier_unavailable_reason("amx")
    if not why:
        assert hina_session(_tiny_model(), isa="amx").get_providers()[0] == "HinaMoE"
        return
    assert "AMX" in why
    with pytest.raises(Exception) as ei:
        hina_session(_tiny_model(), isa="amx")
    msg = error_text(ei.value)
    assert "amx" in msg and "AMX" in msg, msg


def test_isa_env_var():
    code = """
        import sys, onnxruntime as ort, hinamoe
        sys.path.insert(0, ".")
        from support.sessions import error_text
        from hinamoe.models import MoEConfig, build_moe_model
        m, _ = build_moe_model(MoEConfig(hidden=16, inter=8, experts=2, k=1, activation="relu"))
        so = ort.SessionOptions()
        so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
        try:
            s = ort.InferenceSession(m.SerializeToString(), so, providers=["HinaMoE"])
            print("OK", s.get_providers()[0])
        except Exception as e:
            print("ERR", error_text(e))
    """
    good = _python(code, {"HINAMOE_ISA": "ref"})
    assert good.returncode == 0 and "OK HinaMoE" in good.stdout, good.stdout + good.stderr
    bad = _python(code, {"HINAMOE_ISA": "sse9000"})
    assert "ERR" in bad.stdout, bad.stdout + bad.stderr
    err = bad.stdout.split("ERR", 1)[1]
    assert "sse9000" in err and ("HINAMOE_ISA" in err or "isa" in err), bad.stdout


def test_python_m_hinamoe_prints_tier():
    hm = hinamoe
    r = subprocess.run([sys.executable, "-m", "hinamoe"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert hm.best_tier() in r.stdout, r.stdout
    # GQA's tier is named where it differs from the MoE tier (auto on AMX).
    assert ("GQA tier" in r.stdout) == (hm.gqa_tier() != hm.best_tier()), r.stdout


def test_gqa_tier():
    """isa=auto runs GQA on the best tier, except on AMX CPUs (avx2, measured
    faster there); an explicit tier runs GQA on itself; one this CPU cannot
    run, or an unknown name, gives ""."""
    hm = hinamoe
    want = "avx2" if hm.best_tier() == "amx" else hm.best_tier()
    assert hm.gqa_tier() == hm.gqa_tier("auto") == want
    for isa in ("ref", "avx2", "avx512", "amx", "amx-emu"):
        assert hm.gqa_tier(isa) == ("" if hm.tier_unavailable_reason(isa) else isa)
    assert hm.gqa_tier("nope") == ""
