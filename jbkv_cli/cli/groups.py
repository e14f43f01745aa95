"""Option groups: the options several commands share, declared once as a frozen dataclass.

A group's fields are Typer options (``Annotated[type, typer.Option(...)]`` with a default); a
command takes the whole group as one parameter and :func:`with_groups` splices the fields into
the command line in its place::

    @with_groups
    def generate(model: str = "tiny", inputs: Inputs = Inputs(), flags: ModelFlags = ModelFlags()):
        opts = flags.options(model)              # -> the model's options, validated
        items = inputs.items(model, opts)        # -> (case, seeds) pairs, validated

So an option every model command takes is one field in one place: its flag, help, parsing and
validation are here, and ``generate``, ``quantize-eval`` and ``profile-heads`` get it alike. Each
group also knows how to write itself back as arguments (:meth:`OptionGroup.argv`), which is how a
profile records the command that makes it again.
"""

from __future__ import annotations

import functools
import inspect
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields, is_dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, TypeVar, get_args, get_type_hints

from typer.models import OptionInfo

from jbkv_cli.cli.options import (
    VBENCH_SETS,
    CasesOpt,
    DeviceOpt,
    ImageOpt,
    ModelOptionOpt,
    NumChunksOpt,
    PromptOpt,
    PromptsOpt,
    SeedsOpt,
    StepsOpt,
    WeightsOpt,
    WindowOpt,
    model_options,
    parse_seeds,
    prompt_file,
    read_case_items,
    read_prompt_items,
    with_image,
)
from jbkv_cli.models.cases import Case
from jbkv_cli.models.registry import (
    MODELS,
    check_cases,
    check_options,
    check_prompts,
    input_paths,
    load_model,
)
from jbkv_cli.run.fingerprints import case_files, with_digests
from jbkv_cli.utils.errors import JbkvError, UsageError

if TYPE_CHECKING:
    from jbkv_cli.models.contract import VideoModel

F = TypeVar("F", bound=Callable[..., Any])


class OptionGroup:
    """Base of the option groups (frozen dataclasses of Typer-annotated fields)."""

    panel: ClassVar[str] = "Options"

    @classmethod
    def declared(cls) -> dict[str, tuple[Any, Any]]:
        """Field name -> (its ``Annotated`` type, its default), in declaration order."""
        hints = get_type_hints(cls, include_extras=True)
        return {f.name: (hints[f.name], f.default) for f in fields(cls)}

    def argv(self) -> list[str]:
        """The arguments that give this group its values (defaults left out)."""
        args: list[str] = []
        for name, (hint, default) in self.declared().items():
            value = getattr(self, name)
            if value == default:
                continue
            flag = _flag(name, _info(hint))
            if isinstance(value, bool):
                on, _, off = flag.partition("/")
                args.append(on if value else off or "--no-" + on.removeprefix("--"))
                continue
            for item in value if isinstance(value, list) else [value]:
                args += [flag, str(item)]
        return args


def _info(hint: Any) -> OptionInfo:
    return next(a for a in get_args(hint) if isinstance(a, OptionInfo))


def _flag(name: str, info: OptionInfo) -> str:
    """The option's first flag (``--on/--off`` for a switch): in ``Annotated`` use, ``typer.Option``'s first argument
    is kept as its ``default`` until Typer reads it; with none, Typer derives it from the name."""
    decls = [info.default] if isinstance(info.default, str) else []
    decls += list(info.param_decls or ())
    return decls[0] if decls else "--" + name.replace("_", "-")


def _is_group(hint: Any) -> bool:
    return isinstance(hint, type) and issubclass(hint, OptionGroup) and is_dataclass(hint)


def with_groups(command: F) -> F:
    """``command`` with each :class:`OptionGroup` parameter replaced, on the command line, by
    the group's options (at its place, in the group's help panel); the call packs them back."""
    signature = inspect.signature(command)
    hints = get_type_hints(command, include_extras=True)
    params: list[inspect.Parameter] = []
    groups: dict[str, type[OptionGroup]] = {}
    for p in signature.parameters.values():
        hint = hints.get(p.name, p.annotation)
        if not _is_group(hint):
            params.append(p.replace(annotation=hint))
            continue
        groups[p.name] = hint
        for name, (field_hint, default) in hint.declared().items():
            params.append(
                inspect.Parameter(
                    name,
                    p.kind,
                    annotation=_in_panel(field_hint, hint.panel),
                    default=default,
                )
            )
    clash = [n for n, c in Counter(p.name for p in params).items() if c > 1]
    if clash:
        raise TypeError(f"{command.__name__}: option groups repeat {', '.join(clash)}")

    packed = {name: (group, tuple(group.declared())) for name, group in groups.items()}

    @functools.wraps(command)
    def run(**kwargs: Any) -> Any:
        for name, (group, names) in packed.items():
            kwargs[name] = group(**{f: kwargs.pop(f) for f in names})
        return command(**kwargs)

    run.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
    run.__annotations__ = {p.name: p.annotation for p in params}
    return run  # type: ignore[return-value]


def _in_panel(hint: Any, panel: str) -> Any:
    """``hint`` with its ``typer.Option`` shown under ``panel`` in ``--help``."""
    base, *extras = get_args(hint)
    info = _info(hint)
    placed = OptionInfo(**{**vars(info), "rich_help_panel": panel})
    return Annotated[(base, *[placed if e is info else e for e in extras])]


@dataclass(frozen=True)
class ModelFlags(OptionGroup):
    """How a model is loaded and run: ``--weights --num-chunks --steps --window --device -o``."""

    panel: ClassVar[str] = "Model"
    weights: WeightsOpt = None
    num_chunks: NumChunksOpt = None
    steps: StepsOpt = None
    window: WindowOpt = None
    device: DeviceOpt = None
    model_option: ModelOptionOpt = None

    def options(self, model: str) -> dict[str, Any]:
        """The options ``load_model(model, **options)`` takes (``-o`` scoped and parsed)."""
        return model_options(
            self.weights,
            self.num_chunks,
            self.steps,
            self.window,
            self.device,
            self.model_option,
            model=model,
            models=tuple(MODELS),
        )


@dataclass(frozen=True)
class Prompts(OptionGroup):
    """What to generate from text: ``--prompts --prompt --seeds``."""

    panel: ClassVar[str] = "Inputs"
    prompts: PromptsOpt = None
    prompt: PromptOpt = None
    seeds: SeedsOpt = None

    def prompt_items(self, model: str) -> list[tuple[str, list[int]]]:
        """(prompt, seeds) pairs, every prompt checked for file names (:func:`check_prompt`) and
        by the model, before anything is created."""
        from jbkv_cli.run.directory import check_prompt

        pairs = read_prompt_items(self.prompts, self.prompt, model, parse_seeds(self.seeds))
        items = [(check_prompt(p), s) for p, s in pairs]
        check_prompts(model, [p for p, _ in items])
        return items


@dataclass(frozen=True)
class Inputs(Prompts):
    """Everything a video is made from: the prompts, or ``--cases``, and ``--image``."""

    cases: CasesOpt = None
    image: ImageOpt = None

    def items(self, model: str, options: dict[str, Any]) -> list[tuple[Case, list[int]]]:
        """(case, seeds) pairs from ``--cases`` or the prompts, every case's name checked for
        file names and every case checked by the model with its ``options`` (an image or a
        trajectory for a text-only model, a trajectory of the wrong length, …), before anything
        is created; each case carries the digests of its files (a run refuses a resume from
        changed ones: :mod:`jbkv_cli.run.fingerprints`)."""
        from jbkv_cli.run.directory import check_prompt

        if self.cases is None:
            items = [(Case(p), s) for p, s in self.prompt_items(model)]
        else:
            seeds = parse_seeds(self.seeds)
            items = read_case_items(self.cases, self.prompts, self.prompt, seeds)
            for case, _ in items:
                check_prompt(case.name)
        items = with_image(items, self.image, self.cases)
        with model_errors(model):
            check_cases(model, [c for c, _ in items], **options)
        return [(with_digests(c), s) for c, s in items]

    def paths(self, model: str, items: list[tuple[Case, list[int]]]) -> list[Path]:
        """The files these inputs read: the prompt file (none for ``--prompt`` alone or a
        VBench set, which is package data) or the case file, and every case's image
        (``--image`` too) and pose or actions JSON file
        (:func:`~jbkv_cli.run.fingerprints.case_files`)."""
        if self.cases is not None:
            found = [self.cases]
        elif self.prompts in VBENCH_SETS:
            found = []
        else:
            found = [p for p in [prompt_file(self.prompts, self.prompt, model)] if p is not None]
        return found + [p for case, _ in items for p in case_files(case).values()]


def check_model(name: str) -> None:
    """An unknown ``--model`` is a usage error naming the known ones."""
    if name not in MODELS:
        raise UsageError(f"unknown model {name!r}; choose one of: {', '.join(MODELS)}")


@contextmanager
def model_errors(name: str) -> Iterator[None]:
    """Options a model does not take are usage errors; values it refuses, known failures."""
    check_model(name)
    try:
        yield
    except TypeError as exc:
        raise UsageError(f"model {name!r} does not take these options ({exc})") from exc
    except ValueError as exc:
        raise JbkvError(f"model {name!r}: {exc}") from exc


def load(name: str, options: dict[str, Any]) -> VideoModel:
    """``load_model(name, **options)``, its refusals as :func:`model_errors` states them."""
    with model_errors(name):
        return load_model(name, **options)


def model_paths(name: str, options: dict[str, Any]) -> list[Path]:
    """The weight files and folders :func:`load` would read (located, not read: the values of
    :func:`~jbkv_cli.models.registry.input_paths`)."""
    with model_errors(name):
        return list(input_paths(name, **options).values())


def check_load(name: str, options: dict[str, Any]) -> None:
    """Refuse what :func:`load` would refuse, without building the model."""
    with model_errors(name):
        check_options(name, **options)
