"""What a fresh process imports: ml_dtypes (slow to import) only when a state or a manifest
holds one of its dtypes; the CLI's help and light commands none of the array machinery, rich,
or the modules behind other subcommands. Each case runs in a new interpreter, since imports
are per process. Timings are measured by ``benchmarks/startup.py``, never asserted here."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import ml_dtypes
import numpy as np
import pytest


def _run(code: str, *args: str) -> dict:
    """Run ``code`` in a fresh interpreter; it prints one JSON object as its last line."""
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_float32_save_and_load_do_not_import_ml_dtypes(tmp_path):
    out = _run(
        """
        import json, sys
        import numpy as np
        import ckptio
        state = {"w": np.arange(12, dtype=np.float32).reshape(3, 4), "n": np.float32(2.5), "step": 3}
        ckptio.save(state, sys.argv[1], step=1)
        after_save = "ml_dtypes" in sys.modules
        back = ckptio.load(sys.argv[1])
        ok = np.array_equal(back["w"], state["w"]) and back["n"] == state["n"] and back["step"] == 3
        print(json.dumps({"after_save": after_save, "after_load": "ml_dtypes" in sys.modules, "ok": bool(ok)}))
    """,
        str(tmp_path),
    )
    assert out == {"after_save": False, "after_load": False, "ok": True}


def test_unsupported_dtype_is_refused_naming_every_dtype_without_importing_ml_dtypes(tmp_path):
    out = _run(
        """
        import json, sys
        import numpy as np
        import ckptio
        try:
            ckptio.save({"s": np.array(["a"])}, sys.argv[1], step=1)
        except ckptio.CkptioError as err:
            message = str(err)
        print(json.dumps({"message": message, "ml_dtypes": "ml_dtypes" in sys.modules}))
    """,
        str(tmp_path),
    )
    assert not out["ml_dtypes"]
    assert "cannot be checkpointed" in out["message"] and "bfloat16" in out["message"]


def _bf16_state() -> dict:
    a = (np.arange(40, dtype=np.float32) / 7).astype(ml_dtypes.bfloat16).reshape(5, 8)
    return {
        "bf16": a,
        "e4m3": a.astype(ml_dtypes.float8_e4m3fn),
        "e5m2": a.astype(ml_dtypes.float8_e5m2),
        "scalar": a[1, 1],
    }


def test_ml_dtypes_state_round_trips_exactly_and_a_manifest_naming_them_imports_ml_dtypes(tmp_path):
    # save in a fresh process that has only just imported ml_dtypes to build its state
    _run(
        """
        import json, sys
        import numpy as np, ml_dtypes
        import ckptio
        a = (np.arange(40, dtype=np.float32) / 7).astype(ml_dtypes.bfloat16).reshape(5, 8)
        ckptio.save({"bf16": a, "e4m3": a.astype(ml_dtypes.float8_e4m3fn),
                     "e5m2": a.astype(ml_dtypes.float8_e5m2), "scalar": a[1, 1]}, sys.argv[1], step=1)
        print(json.dumps({}))
    """,
        str(tmp_path),
    )
    # load in a fresh process that never imported ml_dtypes: the manifest brings it in
    out = _run(
        """
        import json, sys
        import ckptio
        before = "ml_dtypes" in sys.modules
        back = ckptio.load(sys.argv[1])
        print(json.dumps({"before": before, "after": "ml_dtypes" in sys.modules,
                          "leaves": {k: [str(v.dtype), v.tobytes().hex()] for k, v in back.items()}}))
    """,
        str(tmp_path),
    )
    assert out["before"] is False and out["after"] is True
    expected = {k: [str(v.dtype), v.tobytes().hex()] for k, v in _bf16_state().items()}
    assert out["leaves"] == expected


_HEAVY = (
    "ml_dtypes",
    "numpy",
    "rich",
    "ckptio.checkpoint",
    "ckptio.format",
    "ckptio.runner",
    "ckptio.workload",
    "ckptio.model",
    "ckptio.stallmodel",
    "ckptio.calibration",
    "ckptio.report",
    "ckptio.compare",
)


def _cli(argv: list[str]) -> dict:
    return _run(f"""
        import contextlib, io, json, sys
        from ckptio.cli import main
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            try:
                code = main({argv!r})
            except SystemExit as e:
                code = e.code
        print(json.dumps({{"code": code, "out": out.getvalue(),
                          "imported": sorted(m for m in {_HEAVY!r} if m in sys.modules)}}))
    """)


def test_help_imports_no_array_machinery_rich_or_subcommand_modules():
    out = _cli(["--help"])
    assert out["code"] == 0 and "sweep" in out["out"] and "backends" in out["out"]
    assert out["imported"] == []


@pytest.mark.parametrize(
    ("argv", "allowed"),
    [
        (
            ["backends", "--json"],
            {"numpy", "rich"},
        ),  # numpy: the file:// backend is loaded to list it
        (
            ["model", "--size", "2TB", "--write-bandwidth", "70GB/s", "--json"],
            {"ckptio.stallmodel", "ckptio.calibration", "ckptio.report", "rich"},
        ),
        (["plan", "--preset", "llama3-8b", "--json"], {"ckptio.workload", "numpy", "rich"}),
    ],
)
def test_commands_import_only_what_they_use(argv, allowed):
    out = _cli(argv)
    assert out["code"] == 0, out
    assert set(out["imported"]) <= allowed, out["imported"]


def test_subcommand_help_declares_its_arguments_on_use():
    out = _cli(["run", "--help"])
    assert out["code"] == 0 and "--streams" in out["out"] and "--part-size" in out["out"]
    out = _cli(["sweep", "--help"])
    assert out["code"] == 0 and "--streams" in out["out"]


def test_torch_float32_state_does_not_import_ml_dtypes_and_bfloat16_does(tmp_path):
    pytest.importorskip("torch")
    out = _run(
        """
        import json, sys
        import torch
        import ckptio
        ckptio.save({"w": torch.arange(6, dtype=torch.float32)}, sys.argv[1] + "/f32", step=1)
        back = ckptio.load(sys.argv[1] + "/f32", into={"w": torch.zeros(6)})
        f32 = "ml_dtypes" in sys.modules
        b = (torch.arange(6, dtype=torch.float32) / 3).to(torch.bfloat16)
        ckptio.save({"b": b}, sys.argv[1] + "/bf16", step=1)
        again = ckptio.load(sys.argv[1] + "/bf16", into={"b": torch.zeros(6, dtype=torch.bfloat16)})
        print(json.dumps({"f32": f32, "bf16": "ml_dtypes" in sys.modules,
                          "exact": bool(torch.equal(back["w"], torch.arange(6, dtype=torch.float32))
                                        and torch.equal(again["b"], b))}))
    """,
        str(tmp_path),
    )
    assert out == {"f32": False, "bf16": True, "exact": True}


def test_table_commands_print_with_rich_imported_on_use(tmp_path, capsys):
    """rich is imported by the commands that print, not by the module: each table still prints."""
    import ckptio
    from ckptio.cli import main

    ckptio.save({"w": np.ones(3, np.float32)}, str(tmp_path), step=4)
    for argv in (["ls", str(tmp_path)], ["verify", str(tmp_path)], ["backends"], ["profiles"]):
        assert main(argv) == 0, argv
    out = capsys.readouterr().out
    assert "checkpoints under" in out and "OK" in out and "ckptio backends" in out
