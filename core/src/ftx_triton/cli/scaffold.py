"""``ftx plugin new SLUG``: a family plugin project made from the template shipped inside ftx.

The template (``ftx_triton/plugin_template``, a GPT-2 family) is copied with its slug renamed everywhere a slug
names the plugin: the distribution ``ftx-triton-<slug>``, the import package ``ftx_<slug>``, the entry point and
``Family.name``. What names the *checkpoints* (the Hugging Face ``model_type`` the family claims, its
preset, the transformers class) is left as GPT-2's, for the author to change: the caveats say where.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from ftx_triton.errors import ConfigError, OutputError

TEMPLATE = Path(__file__).resolve().parent.parent / "plugin_template"
TEMPLATE_SLUG = "gpt2"
SLUG = re.compile(r"[a-z][a-z0-9]{0,39}")


def check_slug(slug: str, taken: set[str] | frozenset[str] = frozenset()) -> str:
    """A valid, unused family slug (it becomes ``ftx-triton-<slug>``, ``ftx_<slug>`` and the entry point)."""
    if not SLUG.fullmatch(slug):
        raise ConfigError(
            f"{slug!r} cannot be a plugin slug: it names the distribution ftx-triton-<slug>, the package "
            "ftx_<slug> and the entry point",
            hint="use lower-case letters and digits, starting with a letter (e.g. 'mistral')",
        )
    if slug == "triton":
        raise ConfigError(
            "'triton' cannot be a plugin slug: ftx_triton is ftx's own import package", hint="pick another slug"
        )
    if slug in taken:
        raise ConfigError(f"a family named {slug!r} is already installed", hint="pick another slug")
    return slug


def _renamed(text: str, slug: str) -> str:
    text = text.replace(f"ftx_{TEMPLATE_SLUG}", f"ftx_{slug}").replace(
        f"ftx-triton-{TEMPLATE_SLUG}", f"ftx-triton-{slug}"
    )
    text = re.sub(rf'^{TEMPLATE_SLUG} = "ftx_', f'{slug} = "ftx_', text, flags=re.MULTILINE)  # the entry point
    return re.sub(rf'^(\s+name = )"{TEMPLATE_SLUG}"', rf'\1"{slug}"', text, flags=re.MULTILINE)  # Family.name


def new_plugin(slug: str, dest: Path) -> list[str]:
    """Write the project into ``dest`` (absent or empty; published whole or not at all); return caveats."""
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise OutputError(f"{dest} already exists and is not empty", hint="choose another --dir, or remove it")
    dest.parent.mkdir(parents=True, exist_ok=True)
    from ftx_triton.io.atomic import publish_dir

    with publish_dir(dest, locked=False) as tmp:
        for source in sorted(TEMPLATE.rglob("*")):
            rel = source.relative_to(TEMPLATE)
            if "__pycache__" in rel.parts or source.is_dir():
                continue
            target = tmp / Path(
                *[_renamed(part, slug).replace(f"test_{TEMPLATE_SLUG}_", f"test_{slug}_") for part in rel.parts]
            )
            target.parent.mkdir(parents=True, exist_ok=True)
            if source.suffix in (".py", ".toml", ".md"):
                target.write_text(_renamed(source.read_text(), slug))
            else:
                shutil.copyfile(source, target)
    return [
        f"the family still claims Hugging Face model_type {TEMPLATE_SLUG!r} (hf_model_types, hf_constants, and "
        f"tiny_hf_config in the conformance test) and GPT-2's preset and transformers class: the slug "
        f"{slug!r} names the plugin, the model_type names the checkpoints it converts — set both to yours",
        f"two installed families may not claim one model_type or preset name: rename the {TEMPLATE_SLUG!r} preset",
    ]


__all__ = ["TEMPLATE", "check_slug", "new_plugin"]
