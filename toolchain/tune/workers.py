"""The builder's and the local runner's worker processes kept for a whole tuning process, and both timed as
phases (toolchain/tune/phases.py): MetaSchedule's own start new TVM-importing processes every batch."""

from __future__ import annotations

import functools

from toolchain.tune import phases

#: builds a kept builder worker makes before it is replaced (MetaSchedule restarts its pool every batch for a
#: slow leak in long-lived workers; this bounds it)
BUILD_WORKER_USES = 64


@functools.cache
def kept_runner(timing):
    """This machine's runner, kept for the process."""
    from toolchain.timing import local_runner

    return local_runner(timing)


@functools.cache
def build_pool(max_workers: int, timeout: float):
    """A pool of builder worker processes kept for the process (each replaced after BUILD_WORKER_USES builds)."""
    from tvm.support.popen_pool import PopenPoolExecutor

    return PopenPoolExecutor(max_workers=max_workers, timeout=timeout, maximum_process_uses=BUILD_WORKER_USES)


def pool_build(pool, export, f_build, build_inputs):
    """``LocalBuilder.build`` on a kept pool: each input built (``f_build``) and exported in a worker."""
    from tvm.s_tir.meta_schedule.builder import BuilderResult
    from tvm.s_tir.meta_schedule.builder.local_builder import _serialize_params, _worker_func
    from tvm.support.popen_pool import StatusKind

    jobs = [(f_build, export, b.mod, b.target, _serialize_params(b.params)) for b in build_inputs]
    results = []
    for done in pool.map_with_error_catching(lambda job: _worker_func(*job), jobs):
        if done.status == StatusKind.COMPLETE:
            results.append(BuilderResult(done.value, None))
        elif done.status == StatusKind.TIMEOUT:
            results.append(BuilderResult(None, f"LocalBuilder: Timeout, killed after {pool._timeout} seconds"))
        else:
            results.append(BuilderResult(None, f"LocalBuilder: An exception occurred\n{done.value}"))
    return results


@functools.cache
def timed_builder():
    """A MetaSchedule builder that counts its calls as the ``build`` phase: a kept pool (with its export and
    build function) or a builder it delegates to."""
    from tvm.ir.utils import derived_object
    from tvm.s_tir.meta_schedule.builder import PyBuilder

    @derived_object
    class TimedBuilder(PyBuilder):
        def __init__(self, inner, export=None, f_build=None):
            super().__init__()
            self.inner, self.export, self.f_build = inner, export, f_build

        def build(self, build_inputs):
            with phases.timed("build"):
                if hasattr(self.inner, "map_with_error_catching"):
                    return pool_build(self.inner, self.export, self.f_build, build_inputs)
                return self.inner.build(build_inputs)

    return TimedBuilder


@functools.cache
def timed_runner():
    """A MetaSchedule runner that counts its calls, and the wait for their results, as the ``run`` phase."""
    from tvm.ir.utils import derived_object
    from tvm.s_tir.meta_schedule.runner import PyRunner

    @derived_object
    class TimedRunner(PyRunner):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def run(self, runner_inputs):
            with phases.timed("run"):
                futures = self.inner.run(runner_inputs)
                for future in futures:  # an RPC runner's run returns at once: its time is in the wait
                    future.result()
                return futures

    return TimedRunner
