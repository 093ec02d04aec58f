#!/usr/bin/env python3
"""scripts/check-includes on small trees made to pass or fail (a cycle, the model including the
engine, the CLI including tests/, the library or a face including the lab, the library's CMake building
from the lab), and on this repository.
Standard library only: ctest runs it as `check_includes` (label cpu)."""
import os
import subprocess
import sys
import tempfile
import unittest

REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
SCRIPT = os.path.join(REPO, "scripts", "check-includes")

# A tree that passes: a public header, the model on it and on its own files, the CLI on the case
# table (through a CMake include directory), a test on everything.
CLEAN = {
    "include/twell/ffn.hpp": "#pragma once\n",
    "include/twell/model/runtime.hpp": '#pragma once\n#include "twell/ffn.hpp"\n',
    "src/model/own.hpp": '#pragma once\n#include "twell/model/runtime.hpp"\n',
    "src/model/runtime.cpp": '#include "model/own.hpp"\n#include "cuda/ops/model_ops.hpp"\n',
    "src/cuda/ops/model_ops.hpp": "#pragma once\n",
    "src/cuda/ffn_context.hpp": '#pragma once\n#include "twell/ffn.hpp"\n',
    "bench/ffn/CMakeLists.txt": "target_include_directories(cases INTERFACE ${CMAKE_CURRENT_SOURCE_DIR})\n",
    "bench/ffn/ffn_cases.hpp": '#pragma once\n#include "twell/ffn.hpp"\n',
    "tools/twell/cmd_bench.cpp": '#include "ffn_cases.hpp"\n',
    "tests/test_util.hpp": "#pragma once\n",
    "tests/test_ffn.cpp": '#include "test_util.hpp"\n#include "ffn_cases.hpp"\n#include "cuda/ffn_context.hpp"\n',
}


def run(args):
    p = subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, timeout=60)
    return p.returncode, p.stdout + p.stderr


def check(files):
    """check-includes on CLEAN with `files` added or replaced: (exit status, output)."""
    with tempfile.TemporaryDirectory() as root:
        for path, text in {**CLEAN, **files}.items():
            full = os.path.join(root, path)
            os.makedirs(os.path.dirname(full), exist_ok=True)
            with open(full, "w") as f:
                f.write(text)
        return run(["--root", root])


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

    def test_known_violation_is_a_note(self):
        rc, out = check({"src/model/cuda_runtime.cpp": '#include "cuda/ffn_workspace.hpp"\n',
                         "src/cuda/ffn_workspace.hpp": "#pragma once\n"})
        self.assertEqual(rc, 0, out)
        self.assertIn("note: known violation of issue 57, to be removed: src/model/cuda_runtime.cpp includes "
                      "src/cuda/ffn_workspace.hpp", out)

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
        # The lab's folder on the CLI's include path, as bench/cuda was on the probes'.
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
        self.assertLess(cpu, 2.0, out)

    def test_help(self):
        rc, out = run(["--help"])
        self.assertEqual(rc, 0, out)
        self.assertIn("include cycle", out)


if __name__ == "__main__":
    unittest.main(verbosity=2)
