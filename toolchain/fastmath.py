"""Transcendental ops as vectorisable polynomials (``--fast-math``, the default on CPU targets).

LLVM has no vector ``expf`` / ``erff`` / ``tanhf`` without a vector math library, so TVM's exact
``exp``, ``erf``, ``tanh`` and ``sigmoid`` become one scalar libm call per element inside otherwise
vectorised loops. Measured here (65,536 elements, 2 threads, AVX-512): erf 678 µs exact against
8.5 µs as TOPI's ``fast_erf``, tanh 643 against 14, exp 93 against 25 — BERT's GELU and softmax,
MobileViT's SiLU and softmax spend most of their time there. TOPI's fast versions (Eigen's and
Cephes' polynomials) differ from the exact ones by ≤ 3e-7 absolute on erf and tanh and ≤ 1.2e-7
relative on exp, well inside what ``agoc verify`` accepts; onnxruntime's MLAS uses the same kind of
approximation.

TVM's own ``relax.transform.FastMathTransform`` covers softmax, exp, erf and tanh; sigmoid (SiLU's
half, 34 calls in MobileViT) is missing, so the rules are a table here. The pass runs after the
layout conversion (a ``call_tir`` has no layout rule) and before ``LegalizeOps``.
"""

from __future__ import annotations


def fast_sigmoid(x):
    from tvm import te, tirx, topi

    e = topi.fast_exp(topi.negative(x))
    one = tirx.const(1.0, x.dtype)
    return te.compute(x.shape, lambda *i: one / (one + e(*i)), name="T_fast_sigmoid", tag="elemwise")


def _rules() -> dict:
    """Relax op name → (TE function, how it takes the call's attributes)."""
    from tvm import topi

    return {
        "relax.exp": lambda call: (topi.fast_exp, []),
        "relax.erf": lambda call: (topi.fast_erf, []),
        "relax.tanh": lambda call: (topi.fast_tanh, []),
        "relax.sigmoid": lambda call: (fast_sigmoid, []),
        "relax.nn.softmax": lambda call: (topi.nn.fast_softmax, [int(call.attrs.axis)]),
    }


#: module attribute :func:`toolchain.build.legalize` sets when it rewrote something (see :func:`applied`)
APPLIED_ATTR = "agoc_fast_math"


def applied(mod) -> bool:
    """Whether ``mod`` (legalized) computes some transcendental op with a fast polynomial: a tuning
    session records it, since its kernels, and so their records, differ from the exact ones."""
    return bool(mod.attrs and APPLIED_ATTR in mod.attrs)


#: the ops rewritten (:func:`_rules` builds the functions: importing this module must not import tvm)
FAST_OPS = ("relax.exp", "relax.erf", "relax.tanh", "relax.sigmoid", "relax.nn.softmax")


def fast_math(mod):
    """``mod`` with every float32 op of :data:`FAST_OPS` in its Relax functions replaced by a ``call_tir``
    of its fast version (other dtypes kept exact: the polynomials are fitted for float32)."""
    from tvm import relax
    from tvm.relax import PyExprMutator, expr_functor

    rules = _rules()

    @expr_functor.mutator
    class Rewriter(PyExprMutator):
        def visit_call_(self, call):
            call = super().visit_call_(call)
            if _rewritable(call):
                fn, extra = rules[call.op.name](call)
                return self.builder_.call_te(fn, call.args[0], *extra)
            return call

    rewriter = Rewriter(mod)
    for gv, func in mod.functions_items():
        if isinstance(func, relax.Function):
            rewriter.builder_.update_func(gv, rewriter.visit_expr(func))
    return rewriter.builder_.get()


def _rewritable(expr) -> bool:
    """A float32 call of one of :data:`FAST_OPS`."""
    from tvm import relax

    return (isinstance(expr, relax.Call) and getattr(expr.op, "name", None) in FAST_OPS
            and str(getattr(expr.ty, "dtype", "")) == "float32")


def count_fast(mod) -> int:
    """How many calls :func:`fast_math` would rewrite in ``mod``'s Relax functions (0: it would change nothing)."""
    from tvm import relax

    found = 0

    def visit(expr):
        nonlocal found
        found += _rewritable(expr)

    for _, func in mod.functions_items():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return found
