"""How many compile jobs and nvcc threads a machine can take.

Rule (FlashAttention's, install-anchors.md §1.6 and KB-11): MAX_JOBS x NVCC_THREADS <= logical cores, and
MAX_JOBS x NVCC_THREADS x (GB per nvcc thread) <= available RAM (PR #2079 measured 3.2-5.0 GB per thread).
"""

from __future__ import annotations

from dataclasses import dataclass

GIB = 1 << 30


@dataclass(frozen=True, slots=True, kw_only=True)
class JobSizing:
    """``MAX_JOBS`` and ``NVCC_THREADS`` for one build, and why."""

    max_jobs: int
    nvcc_threads: int
    fits_in_ram: bool
    note: str


def size_jobs(*, cores: int, ram_available_bytes: int, gib_per_thread: int, max_threads: int) -> JobSizing:
    """Size ninja jobs and nvcc threads so both budgets hold.

    Args:
        cores: logical CPUs of the build machine.
        ram_available_bytes: memory free for the build.
        gib_per_thread: peak host memory of one nvcc thread, in GiB (5 for FlashAttention, PR #2079).
        max_threads: the most nvcc threads worth using: nvcc ``--threads`` works on the
        ``-gencode`` targets in
            parallel, so more threads than targets sit idle.

    Returns:
        jobs and threads with ``jobs * threads <= cores`` and ``jobs * threads * gib_per_thread GiB <= RAM``;
        ``fits_in_ram`` is False (and both are 1) when not even one thread fits.
    """
    cores = max(cores, 1)
    slots = ram_available_bytes // (gib_per_thread * GIB)
    if slots < 1:
        return JobSizing(
            max_jobs=1,
            nvcc_threads=1,
            fits_in_ram=False,
            note=f"{ram_available_bytes / GIB:.1f} GiB available is less than the {gib_per_thread} GiB one "
                 f"nvcc "
            "thread needs",
        )
    # Jobs first: ninja spreads translation units over cores with almost no loss, while nvcc --threads only
    # overlaps the -gencode targets of one unit. Threads only take cores that jobs leave idle. (Measured on
    # the H200: 8 jobs x 2 threads built FlashAttention-2 at about half the speed of 16 jobs.)
    jobs = max(1, min(cores, slots))
    threads = max(1, min(max_threads, cores // jobs, slots // jobs))
    return JobSizing(
        max_jobs=jobs,
        nvcc_threads=threads,
        fits_in_ram=True,
        note=f"MAX_JOBS={jobs} x NVCC_THREADS={threads} = {jobs * threads} <= {cores} cores and "
        f"{jobs * threads} x {gib_per_thread} GiB = {jobs * threads * gib_per_thread} GiB <= "
        f"{ram_available_bytes / GIB:.0f} GiB available",
    )
