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



def job_env(*, jobs: int, threads: int, parallel_env: str = "", units: tuple[int, ...] = ()) -> dict[str, str]:
    """The variables that bound a build's compile processes to ``jobs`` in all.

    Args:
        jobs: compile processes the build may run at once (sized by :func:`size_jobs`, ``--jobs`` or a fleet node).
        threads: nvcc ``--threads`` per process (``NVCC_THREADS``).
        parallel_env: the variable through which the recipe's ``setup.py`` builds several extension modules at once
            (SageAttention's ``EXT_PARALLEL``), each with its own ``MAX_JOBS`` ninja jobs; "" when it has none.
        units: the translation units of each extension module the recipe builds (SageAttention on Hopper:
            ``(2, 8, 2, 2)``, from its setup.py).

    Returns:
        ``MAX_JOBS`` and ``NVCC_THREADS``, and with ``parallel_env`` that variable: ``p = min(len(units), jobs)``
        extensions at once, and the largest ``MAX_JOBS`` for which the ``p`` biggest extensions together run at most
        ``jobs`` compile processes (an extension runs ``min(its units, MAX_JOBS)``), so the memory rule of
        :func:`size_jobs` still holds. Each extension has long translation units (160-260 s each for SageAttention at
        sm_90a on the 2-core CI machine): one extension at a time leaves most cores idle.
    """
    jobs = max(jobs, 1)
    env = {"MAX_JOBS": str(jobs), "NVCC_THREADS": str(max(threads, 1))}
    if parallel_env and units:
        sizes = sorted((max(u, 1) for u in units), reverse=True)
        together = min(len(sizes), jobs)

        def running(each: int) -> int:
            return sum(min(u, each) for u in sizes[:together])

        each = max([m for m in range(1, sizes[0] + 1) if running(m) <= jobs], default=1)
        env[parallel_env] = str(together)
        env["MAX_JOBS"] = str(each)
    return env
