"""Shared helpers of the Python tests.

The library stores float32 / float16 / bfloat16 and accumulates in float32; it has no
float64. So references are computed in float32 (from the same, possibly rounded,
inputs) and compared with tolerances per storage dtype, and gradients are compared
with torch autograd of a float32 reference instead of torch.autograd.gradcheck
(which needs float64 to be meaningful).
"""

import importlib.util
import os

import pytest
import torch

import ops_transformer as ot  # noqa: F401

DTYPES = [torch.float32, torch.bfloat16, torch.float16]

# (atol, rtol) of an output, by storage dtype, for values of magnitude ~1.
TOL = {
    torch.float32: (2e-5, 2e-5),
    torch.float16: (2e-3, 2e-3),
    torch.bfloat16: (1.6e-2, 1.6e-2),
}


def assert_close(actual, expected, dtype=None, scale=1.0, msg=""):
    """actual (any dtype) against a float32 reference, with the tolerance of `dtype`."""
    dtype = dtype or actual.dtype
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(actual.float(), expected.float(), atol=atol * scale,
                               rtol=rtol * scale, msg=msg or None)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def leaf(t, requires_grad=True):
    return t.detach().clone().requires_grad_(requires_grad)


def load_script(name, folder="scripts"):
    """FOLDER/NAME.py of the repository (scripts/ or bench/) as a module (neither is a
    package)"""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    spec = importlib.util.spec_from_file_location(name, os.path.join(root, folder, name + ".py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
