"""From an accepted preflight to a :class:`BuildSpec`: archs, MAX_JOBS/NVCC_THREADS, environment, root.

``build_spec(snapshot, catalog, request)`` is what ``attnforge build`` calls; the resolver uses
:func:`plan_build` to get the same answer together with the reasons.
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass
from pathlib import PurePath, PurePosixPath

from packaging.specifiers import InvalidSpecifier, SpecifierSet

from attnforge.catalog import Catalog
from attnforge.catalog.recipes import CPP_RECIPE, GENERIC_RECIPE, Recipe, RecipeKind
from attnforge.catalog.slim import SlimPlan, SlimRequest, plan_slim
from attnforge.catalog.toolchain import format_major_minor
from attnforge.errors import ResolveError, UsageError
from attnforge.probe.snapshot import SystemSnapshot
from attnforge.resolve.cpu_only import cpu_only_source
from attnforge.resolve.jobs import job_env, size_jobs
from attnforge.resolve.preflight import Preflight, abi_edits, builds_stable, run_preflight
from attnforge.resolve.types import BuildSpec, Request, SourceKind, SourceSpec
from attnforge.types.cc import format_cc


@dataclass(frozen=True, slots=True, kw_only=True)
class BuildDecision:
    """A preflight and, when it passed, the spec."""

    recipe: Recipe
    preflight: Preflight
    spec: BuildSpec | None


def pinned_version(version_spec: str) -> str | None:
    """``"==2.8.3"`` -> ``"2.8.3"``; anything that is not one exact pin -> None.

    Raises:
        UsageError: not a PEP 440 specifier.
    """
    text = version_spec.strip()
    if not text:
        return None
    try:
        spec = SpecifierSet(text)
    except InvalidSpecifier:
        raise UsageError(
            f"not a version specifier: {version_spec!r}", hint="write e.g. ==2.8.3 or >=2.8"
        ) from None
    pins = [s for s in spec if s.operator in ("==", "===") and "*" not in s.version]
    return pins[0].version if len(pins) == 1 and len(spec) == 1 else None


def default_source(recipe: Recipe, request: Request) -> SourceSpec:
    """The request's own source, else the recipe's: the PyPI sdist when it has one, else
    its git repository. Either way it carries the recipe's required submodules.

    A local path that *is* the recipe's subdirectory (``~/flash-attention/hopper``) becomes its repository with
    ``#subdirectory=hopper``: hopper/setup.py reads ``../README.md`` and ``../csrc/cutlass``.
    """
    source = request.source
    if source is None:
        version = pinned_version(request.version)
        if recipe.sdist and "pypi-sdist" in recipe.source_kinds:
            return SourceSpec(kind=SourceKind.PYPI_SDIST, location=recipe.sdist, version=version,
                              specifier="" if version else request.version.strip())
        source = SourceSpec(kind=SourceKind.GIT, location=recipe.git_url, ref=None,
                            subdirectory=recipe.git_subdirectory or None)
    sub = recipe.git_subdirectory
    if (source.kind is SourceKind.PATH and sub and source.subdirectory is None
            and PurePath(source.location).name == sub):
        source = dataclasses.replace(source, location=str(PurePath(source.location).parent), subdirectory=sub)
    if recipe.submodules and source.kind in (SourceKind.PATH, SourceKind.GIT) and not source.submodules:
        source = dataclasses.replace(source, submodules=recipe.submodules)
    return source


def slim_plan(recipe: Recipe, request: Request, *, archs: tuple[tuple[int, int], ...], max_jobs: int
              ) -> SlimPlan | None:
    """The slim build ``request.slim`` asks for (None when it asks for none)."""
    if request.slim is None:
        return None
    return plan_slim(recipe.id, recipe.slim, request.slim, archs=archs, max_jobs=max_jobs)


def cached_switch_problem(recipe: Recipe | None, request: Request, flags: tuple[str, ...],
                          *, archs: tuple[tuple[int, int], ...]) -> str | None:
    """Why a cached build's slim switches do not serve ``request`` (it leaves out something asked for), or None.

    A full cached build serves every request; a slim one only requests whose own switches leave out at least
    as much.
    """
    if recipe is None or recipe.slim is None or recipe.slim.unsupported:
        return None
    switch_vars = {*recipe.slim.head_dims.values(), *recipe.slim.dtypes.values(), *recipe.slim.features.values(),
                   *recipe.slim.arch_switches.values(), recipe.slim.backward}
    cached = {f.partition("=")[0] for f in flags if f.partition("=")[0] in switch_vars}
    if not cached:
        return None
    planned = slim_plan(recipe, request, archs=archs, max_jobs=1)
    extra = sorted(cached - set(planned.env if planned else {}))
    if not extra:
        return None
    return (f"a slim build that leaves out what this request needs ({', '.join(extra)}); "
            "ask for the same slim options to reuse it")


def installed_caps_problem(recipe: Recipe | None, request: Request, *,
                           archs: tuple[tuple[int, int], ...]) -> str | None:
    """Why the installed slim build (``request.installed_capabilities``) cannot serve ``request``, or None."""
    have = request.installed_capabilities
    if have is None or recipe is None or recipe.slim is None or recipe.slim.unsupported:
        return None
    planned = slim_plan(recipe, request, archs=archs, max_jobs=1)
    want = planned.capabilities if planned is not None and planned.env else None
    if want is None:
        return f"the installed build is a slim one (it can run {have.describe()}); this request asks for all of it"
    missing = [*(f"head dim {d}" for d in want.head_dims if not any(d <= h for h in have.head_dims)),
               *(d for d in want.dtypes if d not in have.dtypes),
               *(f for f in want.features if f not in have.features),
               *(["the backward pass"] if want.backward and not have.backward else [])]
    return f"the installed slim build lacks {', '.join(missing)}" if missing else None


def slim_offer(recipe: Recipe, *, archs: tuple[tuple[int, int], ...], max_jobs: int) -> str | None:
    """For a full build of a recipe with slim switches: what one head dim in bf16 would cost instead."""
    if recipe.slim is None or recipe.slim.unsupported or not recipe.slim.head_dims:
        return None
    dim = 128 if 128 in recipe.slim.head_dims else min(recipe.slim.head_dims)
    offer = plan_slim(recipe.id, recipe.slim, SlimRequest(head_dims=(dim,), dtypes=("bfloat16",)),
                      archs=archs, max_jobs=max_jobs)
    if offer.units is None or offer.full_units is None or offer.units * 4 > offer.full_units:
        return None
    return (f"a slim build is much cheaper: one head dim in bf16 is {offer.units} of {offer.full_units} "
            f"translation units (~{minutes(offer.estimate_s)} instead of ~{minutes(offer.full_estimate_s)}); "
            f"ask for it with e.g. --head-dim {dim} --dtype bf16 [--no-backward] [--features ...] "
            "or --model config.json")


def minutes(seconds: float | None) -> str:
    return "?" if seconds is None else f"{seconds / 60:.0f} min" if seconds >= 90 else f"{seconds:.0f} s"


def build_recipe(catalog: Catalog, request: Request, *, cpu_only: str | None) -> Recipe | None:
    """The recipe that builds ``request``: the catalog's for a backend it knows (None for one built into torch), else
    the generic torch-extension recipe, or, where ``cpu_only`` (what
    :func:`~attnforge.resolve.cpu_only.cpu_only_source` says of the request's source on the building machine) is
    not None, the C++-only one, whose memory and disk floors are g++'s, not nvcc's."""
    recipe = catalog.recipe(request.backend)
    if recipe is not None and recipe.id == GENERIC_RECIPE and cpu_only is not None:
        return catalog.recipes.get(CPP_RECIPE, recipe)
    return recipe


def plan_build(
    snapshot: SystemSnapshot, catalog: Catalog, request: Request, *, home: str | None = None
) -> BuildDecision:
    """Run the preflight and, when nothing fails, size the build.

    Raises:
        UsageError: the backend has no build recipe (it ships in torch) or the version text is not PEP 440.
    """
    cpu_only = cpu_only_source(request.source, os=snapshot.platform.os)  # walks a local source tree: asked once
    recipe = build_recipe(catalog, request, cpu_only=cpu_only)
    if recipe is None or recipe.kind is not RecipeKind.BUILD:
        what = (
            "ships inside torch" if recipe is None else "is pure Python (pip installs it, nothing to compile)"
        )
        raise UsageError(
            f"{request.backend} has nothing to build: it {what}",
            hint=f"attnforge plan {request.backend} shows how to get it",
        )
    pre = run_preflight(snapshot, catalog, request, recipe, cpu_only=cpu_only)
    if not pre.ok:
        return BuildDecision(recipe=recipe, preflight=pre, spec=None)
    return BuildDecision(recipe=recipe, preflight=pre, spec=_spec(snapshot, request, recipe, pre, home))


def build_spec(
    snapshot: SystemSnapshot, catalog: Catalog, request: Request, *, home: str | None = None
) -> BuildSpec:
    """Everything a source build of ``request`` on ``snapshot`` needs, decided before any compiler runs.

    Args:
        snapshot: the machine that builds (``collect_snapshot()`` or a saved
        ``--snapshot`` file). catalog: ``load_catalog()``.
        request: backend (a catalog id, or any name with ``request.source`` set), version, ``archs`` (None =
            the detected GPUs'), ``source`` (None = the recipe's default).
        home: the attnforge home the build root goes under; default: the snapshot's
            ``disk_path`` (where its cache lives).

    Returns:
        The :class:`BuildSpec`: ``env`` holds the arch variable in the recipe's format
        (``FLASH_ATTN_CUDA_ARCHS="90"`` or ``TORCH_CUDA_ARCH_LIST="9.0"``), the recipe's fixed variables
        (``FLASH_ATTENTION_FORCE_BUILD=TRUE``), ``MAX_JOBS``/``NVCC_THREADS`` and ``CUDA_HOME``/``CUDA_PATH``.

    Raises:
        ResolveError: the preflight failed (``cause`` lists every failed check with its fix), or ``--offline``
            and the source is not local.
        UsageError: nothing to build for this backend, or a bad version text.
    """
    decision = plan_build(snapshot, catalog, request, home=home)
    if decision.spec is None:
        failures = decision.preflight.failures
        raise ResolveError(
            f"{request.backend} cannot be built on this machine ({len(failures)} problem(s))",
            cause="\n".join(f.text() for f in failures),
            hint=failures[0].fix,
        )
    offline = offline_problem(request, decision.spec.source)
    if offline is not None:
        raise ResolveError(f"{request.backend} cannot be built offline", cause=offline,
                           hint="pass a local --source (a directory or an sdist), or drop --offline")
    return decision.spec


def offline_problem(request: Request, source: SourceSpec) -> str | None:
    """Why ``--offline`` forbids building ``source`` (anything but a local path is downloaded), or None."""
    if request.offline and source.kind is not SourceKind.PATH:
        return f"--offline: the {source.kind.value} source cannot be downloaded; pass a local --source"
    return None


def _spec(
    snapshot: SystemSnapshot, request: Request, recipe: Recipe, pre: Preflight, home: str | None
) -> BuildSpec:
    if pre.toolkit is None and not pre.cpu_only:  # a passed CUDA preflight always chose a toolkit
        raise ResolveError("internal: a passed preflight without a toolkit")
    windows = snapshot.platform.os == "windows"
    gencode_targets = len(pre.targets) + (1 if recipe.adds_ptx else 0)
    sizing = size_jobs(
        cores=snapshot.platform.cores,
        ram_available_bytes=snapshot.platform.ram_available_bytes,
        gib_per_thread=recipe.gb_per_nvcc_thread,
        max_threads=min(recipe.nvcc_threads, max(gencode_targets, 1)),
    )
    env: dict[str, str] = {}
    if recipe.arch_env and not pre.cpu_only:
        env[recipe.arch_env] = recipe.arch_value(pre.targets)
    env.update(recipe.env)
    slim = slim_plan(recipe, request, archs=pre.archs, max_jobs=sizing.max_jobs)
    if slim is not None:
        env.update(slim.env)
    env.update(job_env(jobs=sizing.max_jobs, threads=sizing.nvcc_threads, parallel_env=recipe.parallel_env,
                       units=recipe.extension_units))
    if pre.toolkit is not None:
        env["CUDA_HOME"] = pre.toolkit.path
        env["CUDA_PATH"] = pre.toolkit.path
    if windows:
        env["DISTUTILS_USE_SDK"] = "1"
        env["TORCH_EXTENSION_SKIP_NVCC_GEN_DEPENDENCIES"] = "1"
    if pre.nvcc_flags:  # Linux --allow-unsupported-compiler (Windows: the executor adds it with vcvars)
        user = snapshot.env.get("NVCC_APPEND_FLAGS", "").split()
        env["NVCC_APPEND_FLAGS"] = " ".join(user + [f for f in pre.nvcc_flags if f not in user])

    source = default_source(recipe, request)
    version = source.version or pinned_version(request.version)
    name = recipe.distribution or request.backend
    edits = abi_edits(snapshot, recipe, request)
    leaf = _leaf(name, version, pre, source, ','.join([*(slim.env if slim else ()), *(e.digest() for e in edits)]))
    notes = [c.reason for c in pre.checks if c.name == "archs"]
    notes.append(sizing.note)
    if recipe.parallel_env:
        notes.append(f"{len(recipe.extension_units)} extension modules ({'+'.join(map(str, recipe.extension_units))} "
                     f"translation units) built side by side: {recipe.parallel_env}={env[recipe.parallel_env]}, "
                     f"MAX_JOBS={env['MAX_JOBS']} each, at most {sizing.max_jobs} compiles at once")
    if not recipe.arch_env and recipe.targets:  # the C++-only recipe has neither
        notes.append(
            f"{recipe.id} fixes its archs in setup.py ({', '.join(str(t) for t in recipe.targets)}); "
            "no arch variable is set"
        )
    notes.extend(pre.notes)
    notes.extend(c.reason for c in pre.checks if c.name == "abi")
    if (request.abi is None and not pre.cpu_only and recipe.per_torch is not None and recipe.stable_abi_from
            and builds_stable(snapshot, recipe)):
        notes.append(f"{recipe.id} builds the libtorch stable ABI with torch >= "
                     f"{format_major_minor(recipe.stable_abi_from)} (one binary for every newer torch); "
                     f"--abi torch binds it to this torch instead: {recipe.per_torch.gain}"
                     " (docs/slim-builds.md), a rebuild when torch changes")
    if slim is not None:
        notes.append(slim.note or _slim_note(slim))
    else:
        offer = slim_offer(recipe, archs=pre.archs, max_jobs=sizing.max_jobs)
        if offer:
            notes.append(offer)
    base = home or snapshot.platform.disk_path
    if windows:
        from attnforge.resolve.windows import short_build_root

        build_root, why = short_build_root(base, leaf)
        if why:
            notes.append(why)
    else:
        build_root = str(PurePosixPath(base) / "b" / leaf)
    return BuildSpec(
        name=name,
        version=version,
        source=source,
        archs=pre.archs,
        max_jobs=sizing.max_jobs,
        nvcc_threads=sizing.nvcc_threads,
        env=env,
        build_root=build_root,
        toolkit=pre.toolkit,
        python=snapshot.platform.python_executable,
        use_sccache=False,
        notes=tuple(notes),
        msvc_toolset=pre.msvc_toolset,
        allow_unsupported_compiler=request.allow_unsupported_compiler,
        capabilities=slim.capabilities if slim is not None and slim.env else None,
        slim=slim if slim is not None and slim.env else None,
        edits=edits,
        abi=request.abi,
        parallel_env=recipe.parallel_env,
        extension_units=recipe.extension_units,
    )


def _slim_note(slim: SlimPlan) -> str:
    units = (f": {slim.units} of {slim.full_units} translation units, ~{minutes(slim.estimate_s)} instead of "
             f"~{minutes(slim.full_estimate_s)} (estimated from one recorded build)"
             if slim.units is not None else "")
    return f"slim build{units}; leaves out {'; '.join(slim.left_out) or 'nothing'}"


def _leaf(name: str, version: str | None, pre: Preflight, source: SourceSpec, switches: str) -> str:
    """An 8-hex directory name: short (Windows paths) and stable for the same build."""
    text = "|".join(
        [
            name,
            version or "",
            source.kind.value,
            source.location,
            source.ref or "",
            source.subdirectory or "",
            ",".join(format_cc(c) for c in pre.archs),
            pre.toolkit.version if pre.toolkit else "",
            *([switches] if switches else []),
        ]
    )
    return hashlib.sha256(text.encode()).hexdigest()[:8]
