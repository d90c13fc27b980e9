"""The cache lines an intensive tile's slice of its intermediates touches: the arithmetic behind the tile caps of
toolchain/tune/intensive.py (`--keep-inside`). Why: docs/tuning-internals.md (Intensive fusion)."""

from __future__ import annotations

from typing import Callable

from toolchain.geometry import LINE
from toolchain.tune.transfer import divisors

TILE_FACTOR_MAX = 64  # D's tiled-dim inner factor (the tile the intensive fusion keeps in cache)
#: a chain's head computes at most this share of its rows twice, or the chain is not made (the partition's
#: locality units) or, made, is fused as a pair (toolchain/tune/pairs.py find_pair)
CHAIN_RECOMPUTE = 0.25


def touched(count: int, run: int, stride: int, line: int = LINE) -> int:
    """Bytes of the cache lines a slice touches: ``count`` runs of ``run`` contiguous bytes, ``stride``
    bytes apart (runs taken to start on a line; runs closer than a line touch every line of their span)."""
    if count <= 1 or stride <= run:
        return -(-count * run // line) * line
    if stride >= line:
        return count * -(-run // line) * line
    return -(-((count - 1) * stride + run) // line) * line


def tile_units(kind: str, shape: tuple[int, ...],
               layout: str = "NCHW") -> dict[int, tuple[int, int, Callable[[int], int]]]:
    """D's tiled iterators, each → (its extent, bytes of the intermediate one step covers, bytes of the cache
    lines a tile of ``f`` steps touches), for D of ``kind`` ("dw" | "pw" | "matmul") whose data input (the
    intermediate, float32) has ``shape``: dw a channel plane (in NHWC a run of channels in every pixel: a
    slice narrower than a line touches as many lines as one a line wide); pw a whole row (the columns then
    one pixel of every channel); matmul a row."""
    if kind in ("dw", "pw"):  # D's iterators: NCHW (n, f, y, x), NHWC (n, y, x, f)
        nhwc = layout == "NHWC"
        (_, h, w, c), (f_it, y_it, x_it) = (shape, (3, 1, 2)) if nhwc else (
            (shape[0], shape[2], shape[3], shape[1]), (1, 2, 3))
        if kind == "dw" and nhwc:
            return {f_it: (c, h * w * 4, lambda f: touched(h * w, 4 * f, 4 * c))}
        if kind == "dw":
            return {f_it: (c, h * w * 4, lambda f: touched(1, f * h * w * 4, 0))}
        if nhwc:
            return {y_it: (h, w * c * 4, lambda f: touched(1, f * w * c * 4, 0)),
                    x_it: (w, c * 4, lambda f: touched(1, f * c * 4, 0))}
        return {y_it: (h, w * c * 4, lambda f: touched(c, f * w * 4, h * w * 4)),
                x_it: (w, c * 4, lambda f: touched(c, f * 4, h * w * 4))}
    *_, rows, k = shape
    return {len(shape) - 2: (rows, k * 4, lambda f: touched(1, f * k * 4, 0))}


def window_rows(rows_in: int, rows_out: int, window: int) -> Callable[[int], int]:
    """The input rows ``f`` output rows of a sliding window of ``window`` rows read, for a window that takes
    ``rows_in`` (padded) rows to ``rows_out`` (its stride inferred)."""
    stride = max(1, (rows_in - window) // (rows_out - 1)) if rows_out > 1 else 1
    return lambda f: (f - 1) * stride + window


def chain_rows(rows: int, row_bytes: int, rows_in: int, row_in_bytes: int, window: int,
               budget: int, cores: int = 1) -> tuple[int, Callable[[int], int]]:
    """(the widest row tile ``budget`` holds, bytes of the lines a tile of ``f`` rows touches) for a chain whose D has
    ``rows`` output rows and whose U keeps one row of ``row_bytes`` while its window of ``window`` rows reads the
    head's (padded) ``rows_in`` rows of ``row_in_bytes``; the tile at most a core's share of the rows."""
    need = window_rows(rows_in, rows, window)

    def lines(f: int) -> int:
        return touched(1, row_bytes, 0) + touched(1, need(f) * row_in_bytes, 0)

    return row_cap(rows, lines, budget, cores), lines


def row_cap(rows: int, lines: Callable[[int], int], budget: int, cores: int = 1) -> int:
    """The widest tile of ``rows`` whose ``lines`` fit ``budget`` (1 where none does), at most a core's share."""
    cap = max([f for f in range(1, rows + 1) if lines(f) <= budget] or [1])
    return min(cap, max(1, rows // cores))


def chain_share(rows: int, row_bytes: int, rows_in: int, row_in_bytes: int, window: int,
                budget: int, cores: int = 1) -> float:
    """The share of its rows a chain's head computes twice at the widest row tile :func:`chain_rows` allows, taken as a
    divisor of the rows as the space samples it: the window's halo at the seams of each core's run of tiles where
    there are more tiles than cores (a line buffer per core: tune/rolling.py), else at every tile's."""
    cap, _ = chain_rows(rows, row_bytes, rows_in, row_in_bytes, window, budget, cores)
    need = window_rows(rows_in, rows, window)
    f = max(k for k in divisors(rows) if k <= cap)
    tiles = rows // f
    if tiles > cores:  # each core's run of tiles in order, its head computing each row once (tune/rolling.py)
        run = -(-tiles // cores) * f
        return max(0.0, sum(need(min(run, rows - start)) for start in range(0, rows, run)) / need(rows) - 1)
    return tiles * need(f) / need(rows) - 1
