#!/usr/bin/env python3
"""scripts/check-includes on small trees made to pass or fail (a cycle, the model including the
engine, an op including the engine, the CLI including tests/, the library or a face including the lab, the
library's CMake building from the lab), and on this repository.
Standard library only: ctest runs it as `check_includes` (label cpu)."""
import contextlib
import importlib.machinery
import importlib.util
import io
import os
import subprocess
import sys
import tempfile
import unittest

REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
SCRIPT = os.path.join(REPO, "scripts", "check-includes")

# A tree that passes: a public header, the model on it and on its own files and ops, the ops on
# common/ and public headers, the engine on the ops, the CLI on the case table (through a CMake
# include directory), a test on everything.
CLEAN = {
    "include/twell/ffn.hpp": "#pragma once\n",
    "include/twell/model/runtime.hpp": '#pragma once\n#include "twell/ffn.hpp"\n',
    "src/model/own.hpp": '#pragma once\n#include "twell/model/runtime.hpp"\n',
    "src/model/runtime.cpp": '#include "model/own.hpp"\n#include "cuda/ops/model_ops.hpp"\n',
    "src/cuda/ops/model_ops.hpp": "#pragma once\n",
    "src/cuda/ops/gemv.cu": '#include "cuda/common/check.hpp"\n#include "twell/ffn.hpp"\n',
    "src/cuda/common/check.hpp": "#pragma once\n",
    "src/cuda/ffn_context.hpp": '#pragma once\n#include "twell/ffn.hpp"\n#include "cuda/ops/model_ops.hpp"\n',
    "bench/ffn/CMakeLists.txt": "target_include_directories(cases INTERFACE ${CMAKE_CURRENT_SOURCE_DIR})\n",
    "bench/ffn/ffn_cases.hpp": '#pragma once\n#include "twell/ffn.hpp"\n',
    "tools/twell/cmd_bench.cpp": '#include "ffn_cases.hpp"\n',
    "tests/test_util.hpp": "#pragma once\n",
    "tests/test_ffn.cpp": '#include "test_util.hpp"\n#include "ffn_cases.hpp"\n#include "cuda/ffn_context.hpp"\n',
}


def run(args):
    p = subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, timeout=60)
    return p.returncode, p.stdout + p.stderr


@contextlib.contextmanager
def tree(files):
    """A temporary tree: CLEAN with `files` added or replaced. Yields its root."""
    with tempfile.TemporaryDirectory() as root:
        for path, text in {**CLEAN, **files}.items():
            full = os.path.join(root, path)
            os.makedirs(os.path.dirname(full), exist_ok=True)
            with open(full, "w") as f:
                f.write(text)
        yield root


def check(files):
    """check-includes on CLEAN with `files` added or replaced: (exit status, output)."""
    with tree(files) as root:
        return run(["--root", root])


def check_known(files, known):
    """As check(), in this process, with the script's KNOWN_VIOLATIONS set to `known`."""
    loader = importlib.machinery.SourceFileLoader("check_includes", SCRIPT)
    spec = importlib.util.spec_from_loader("check_includes", loader)
    script = importlib.util.module_from_spec(spec)
    loader.exec_module(script)
    script.KNOWN_VIOLATIONS = known
    out, argv = io.StringIO(), sys.argv
    with tree(files) as root, contextlib.redirect_stdout(out):
        sys.argv = ["check-includes", "--root", root]
        try:
            rc = script.main()
        finally:
            sys.argv = argv
    return rc, out.getvalue()


class CheckIncludes(unittest.TestCase):
    def test_clean_tree_passes(self):
        rc, out = check({})
        self.assertEqual(rc, 0, out)
        self.assertIn("0 cycle(s), 0 new layering violation(s)", out)

    def test_cycle_fails_with_the_chain(self):
        rc, out = check({"src/cuda/a.hpp": '#include "b.hpp"\n', "src/cuda/b.hpp": '#include "cuda/c.hpp"\n',
                         "src/cuda/c.hpp": '#include "a.hpp"\n'})
        self.assertEqual(rc, 1, out)
        self.assertIn("include cycle: src/cuda/a.hpp -> src/cuda/b.hpp -> src/cuda/c.hpp -> src/cuda/a.hpp", out)

    def test_self_include_is_a_cycle(self):
        rc, out = check({"include/twell/ffn.hpp": '#pragma once\n#include "twell/ffn.hpp"\n'})
        self.assertEqual(rc, 1, out)
        self.assertIn("include cycle: include/twell/ffn.hpp -> include/twell/ffn.hpp", out)

    def test_model_including_the_engine_fails(self):
        rc, out = check({"src/model/runtime.cpp": '#include "cuda/ffn_context.hpp"\n'})
        self.assertEqual(rc, 1, out)
        self.assertIn("error: src/model/runtime.cpp includes src/cuda/ffn_context.hpp", out)

    def test_runtime_including_the_engine_internals_fails(self):
        # The three includes issue 57 removed from the CUDA runtime: the workspace, the engine's
        # kernels, its host helpers. None is known any more.
        for inc, target in (("cuda/ffn_workspace.hpp", "src/cuda/ffn_workspace.hpp"),
                            ("cuda/sm80/twell_gemv.hpp", "src/cuda/sm80/twell_gemv.hpp"),
                            ("cuda/host_util.hpp", "src/cuda/host_util.hpp")):
            with self.subTest(inc=inc):
                rc, out = check({"src/model/cuda_runtime.cpp": f'#include "{inc}"\n', target: "#pragma once\n"})
                self.assertEqual(rc, 1, out)
                self.assertIn(f"error: src/model/cuda_runtime.cpp includes {target}", out)

    def test_ops_including_the_engine_or_the_model_fails(self):
        # rmsnorm_project.cu included the engine's GEMV (sm80/) before issue 57 moved it to ops/.
        engine = {"src/cuda/sm80/twell_gemv.hpp": "#pragma once\n", "src/cuda/ffn_workspace.hpp": "#pragma once\n",
                  "src/cuda/host_util.hpp": "#pragma once\n", "src/cuda/sm90/gate_pack.hpp": "#pragma once\n",
                  "include/twell/cuda/ffn_layer.hpp": "#pragma once\n"}
        for path, inc, target in (
                ("src/cuda/ops/rmsnorm_project.cu", "cuda/sm80/twell_gemv.hpp", "src/cuda/sm80/twell_gemv.hpp"),
                ("src/cuda/ops/gemv.cu", "cuda/sm90/gate_pack.hpp", "src/cuda/sm90/gate_pack.hpp"),
                ("src/cuda/common/transfer.hpp", "cuda/host_util.hpp", "src/cuda/host_util.hpp"),
                ("src/cuda/common/launch.hpp", "../ffn_workspace.hpp", "src/cuda/ffn_workspace.hpp"),
                ("src/cuda/dense/lt_gemm.hpp", "cuda/ffn_context.hpp", "src/cuda/ffn_context.hpp"),
                ("src/cuda/ops/model_ops.hpp", "twell/cuda/ffn_layer.hpp", "include/twell/cuda/ffn_layer.hpp"),
                ("src/cuda/ops/attention.cu", "twell/model/runtime.hpp", "include/twell/model/runtime.hpp")):
            with self.subTest(path=path, inc=inc):
                rc, out = check({**engine, path: f'#include "{inc}"\n'})
                self.assertEqual(rc, 1, out)
                self.assertIn(f"error: {path} includes {target}: the ops", out)

    def test_known_violation_is_a_note(self):
        files = {"src/model/cuda_runtime.cpp": '#include "cuda/ffn_workspace.hpp"\n',
                 "src/cuda/ffn_workspace.hpp": "#pragma once\n"}
        rc, out = check_known(files, {("src/model/cuda_runtime.cpp", "src/cuda/ffn_workspace.hpp"): "why"})
        self.assertEqual(rc, 0, out)
        self.assertIn("note: known violation of issue 57, to be removed: src/model/cuda_runtime.cpp includes "
                      "src/cuda/ffn_workspace.hpp: why", out)
        self.assertIn("0 new layering violation(s), 1 known, 0 CMake path(s) into lab/: ok", out)
        # A known violation that is gone is a note to remove it, not a failure.
        rc, out = check_known({}, {("src/model/cuda_runtime.cpp", "src/cuda/ffn_workspace.hpp"): "why"})
        self.assertEqual(rc, 0, out)
        self.assertIn("src/model/cuda_runtime.cpp no longer includes src/cuda/ffn_workspace.hpp: remove it", out)

    def test_cli_including_tests_fails(self):
        # As the CLI was built before issue 57: tests/ on its include path.
        rc, out = check({"tools/twell/CMakeLists.txt":
                         "target_include_directories(twell_cli PRIVATE ${PROJECT_SOURCE_DIR}/tests)\n",
                         "tools/twell/cmd_bench.cpp": '#include "test_util.hpp"\n'})
        self.assertEqual(rc, 1, out)
        self.assertIn("error: tools/twell/cmd_bench.cpp includes tests/test_util.hpp", out)

    def test_library_including_the_lab_fails(self):
        rc, out = check({"lab/probes/probe_util.hpp": "#pragma once\n",
                         "src/cuda/ffn_context.hpp": '#pragma once\n#include "../../lab/probes/probe_util.hpp"\n'})
        self.assertEqual(rc, 1, out)
        self.assertIn("error: src/cuda/ffn_context.hpp includes lab/probes/probe_util.hpp", out)

    def test_faces_including_the_lab_fail(self):
        # The lab's folder on the CLI's include path, as lab/bench is on the probes'.
        rc, out = check({"lab/probes/probe_graph.cuh": "#pragma once\n",
                         "tools/twell/CMakeLists.txt":
                         "target_include_directories(twell_cli PRIVATE ${PROJECT_SOURCE_DIR}/lab/probes)\n",
                         "tools/twell/cmd_bench.cpp": '#include "ffn_cases.hpp"\n#include "probe_graph.cuh"\n',
                         "python/src/module.cpp": '#include "../../lab/probes/probe_graph.cuh"\n'})
        self.assertEqual(rc, 1, out)
        self.assertIn("error: tools/twell/cmd_bench.cpp includes lab/probes/probe_graph.cuh", out)
        self.assertIn("error: python/src/module.cpp includes lab/probes/probe_graph.cuh", out)

    def test_library_cmake_naming_the_lab_fails(self):
        rc, out = check({"lab/probes/probe_l2.cu": "\n",
                         "src/cuda/CMakeLists.txt": "# lab/ is not ours\n"
                                                    "add_library(twell_cuda ffn.cu ${PROJECT_SOURCE_DIR}/lab/probes/probe_l2.cu)\n",
                         "lab/CMakeLists.txt": "add_executable(p ${PROJECT_SOURCE_DIR}/lab/probes/probe_l2.cu)\n"})
        self.assertEqual(rc, 1, out)
        self.assertIn("error: src/cuda/CMakeLists.txt:2 names the lab", out)
        self.assertNotIn("CMakeLists.txt:1 names the lab", out)  # a comment; and lab/ may name itself
        self.assertIn("1 CMake path(s) into lab/", out)

    def test_public_header_including_src_fails(self):
        rc, out = check({"include/twell/ffn.hpp": '#pragma once\n#include "../../src/cuda/ffn_context.hpp"\n',
                         "src/cuda/ffn_context.hpp": "#pragma once\n"})
        self.assertEqual(rc, 1, out)
        self.assertIn("error: include/twell/ffn.hpp includes src/cuda/ffn_context.hpp", out)

    def test_this_repository_passes_fast(self):
        # Its CPU time, not the wall clock: ctest runs other tests beside it.
        t = os.times()
        rc, out = run([])
        cpu = sum(os.times()[2:4]) - sum(t[2:4])
        self.assertEqual(rc, 0, out)
        self.assertIn("0 cycle(s), 0 new layering violation(s), 0 known, 0 CMake path(s) into lab/: ok", out)
        self.assertLess(cpu, 2.0, out)

    def test_help(self):
        rc, out = run(["--help"])
        self.assertEqual(rc, 0, out)
        self.assertIn("include cycle", out)


if __name__ == "__main__":
    unittest.main(verbosity=2)
