// The PyTorch package of `export --torch DIR` (docs/design/torch.md): the exported .cu with the
// package's files (templates/torch/, embedded) around it, and what this attntune can tune.
#pragma once
#include <string>

#include "core/output_file.hpp"

namespace attntune {

// Writes DIR/pyproject.toml and DIR/attntune/{__init__.py, _build.py, _ops.cpp, kernels.json,
// tuner.json, kernels.cu} (kernels.cu last: a package is whole or is not one). DIR is created, or
// must be empty, or hold a package this wrote before (its files are replaced): InputError for
// anything else, before a byte is written. `source` is the export's .cu, `info` its kernel-info
// JSON; every file goes through write_output_file with `databases` protected.
void write_torch_package(const std::string& dir, const std::string& source, const std::string& info,
                         const ProtectedDatabases& databases);

// tuner.json: each family with a shipped space, the problem values it supports and the regimes it
// tunes ({"families": [{"family", "support": {"d": ["64", ...], "dtype": [...], "window": ["0", "1"],
// "softcap": [...], "sinks": [...][, "pass": ["bwd"]]}, "regimes": ["prefill", "chunk", "varlen"]}]}),
// for the package's coverage_plan() (it never offers a problem no family tunes). "pass": the passes a
// family tunes, where its space names them (a backward family's ["bwd"]; absent: the forward alone).
std::string tuner_support_json();

}  // namespace attntune
