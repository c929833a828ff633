"""``hina-bench serve`` against a running hina-serve: every request is
counted, its tokens are what was asked, the table, JSON and plot are
written."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("httpx")
pytest.importorskip("fastapi")

from support.serve_support import server, tiny_model  # noqa: F401,E402  (fixtures)


def test_bench_serve_counts_every_request(server, tmp_path, capsys):  # noqa: F811
    from hinamoe.bench.cli import main

    out, png = tmp_path / "serve.json", tmp_path / "serve.png"
    rc = main(["serve", f"hina={server.url}", "--clients", "1,3", "--requests", "5", "--rounds", "2",
               "--max-tokens", "9", "--prompt-words", "6", "--json", str(out), "--plot", str(png)])
    assert rc == 0
    data = json.loads(out.read_text())
    assert [(r["clients"], r["failures"], r["requests"]) for r in data["summary"]] == [(1, 0, 10), (3, 0, 10)]
    for run in data["runs"]:
        assert run["tokens"] == 5 * 9 and len(run["ttft_s"]) == 5 and run["tok_s"] > 0
        assert all(0 < t < run["wall_s"] for t in run["ttft_s"])
    assert png.stat().st_size > 0
    assert "vs hina" in capsys.readouterr().out


def test_bench_serve_reports_an_unreachable_server(capsys):
    from hinamoe.bench.cli import main

    from support.serve_support import free_port

    assert main(["serve", f"http://127.0.0.1:{free_port()}", "--rounds", "1"]) == 2
    assert "no /v1/models answer" in capsys.readouterr().out


def test_serve_soak_counts_good_and_bad_requests(server, tmp_path):  # noqa: F811
    from hinamoe.bench.cli import main

    out = tmp_path / "soak.json"
    rc = main(["serve-soak", server.url, "--clients", "3", "--minutes", "0.1", "--bad-every", "3",
               "--max-tokens", "6", "--warmup-s", "0", "--json", str(out)])
    data = json.loads(out.read_text())
    assert rc == 0 and data["failures"] == 0, data["errors"]
    assert data["good"] >= 3 and data["bad_answered"] >= 1
    assert data["tokens"] == 6 * data["good"]
    assert data["memory_summary"]["max_mib"] > 0
    assert server.alive()
