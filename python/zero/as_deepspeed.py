"""Run a DeepSpeed script on zero, unchanged: the name `deepspeed` resolves to zero's
DeepSpeed-compatible module (zero._deepspeed) in this process only.

    python -m zero.as_deepspeed train.py --deepspeed ds_config.json ...
    torchrun --nproc-per-node 2 -m zero.as_deepspeed train.py ...
    python -m zero.as_deepspeed -m package.module ...     (a module instead of a script)

From a notebook or a script of your own, before anything imports deepspeed:

    import zero.as_deepspeed; zero.as_deepspeed.install()

install() puts `deepspeed` and its submodules into sys.modules and makes importlib.metadata
report a DeepSpeed version that accelerate and transformers accept (DEEPSPEED_VERSION). Nothing
is written anywhere: a real DeepSpeed installed beside zero stays installed, and other processes
still import it. Rank 0 (RANK unset or 0) prints one line saying zero serves DeepSpeed's API.
"""
import importlib
import importlib.abc
import importlib.metadata
import os
import pkgutil
import runpy
import sys

# The DeepSpeed release whose API zero follows (shared/SPEC_DEEPSPEED.md); the local label names
# what really serves it.
DEEPSPEED_BASE_VERSION = "0.19.0"

def deepspeed_version():
    from . import __version__
    return f"{DEEPSPEED_BASE_VERSION}+zero{__version__}"


class _Distribution(importlib.metadata.Distribution):
    """The metadata `importlib.metadata.metadata("deepspeed")` finds: zero's."""

    def read_text(self, filename):
        if filename == "METADATA":
            return (f"Metadata-Version: 2.1\nName: deepspeed\nVersion: {deepspeed_version()}\n"
                    "Summary: zero serving DeepSpeed's Python API in this process "
                    "(python -m zero.as_deepspeed)\n")
        return None

    def locate_file(self, path):
        return os.path.join(os.path.dirname(__file__), "_deepspeed", str(path))


class _MetadataFinder(importlib.abc.MetaPathFinder):
    """First on sys.meta_path: answers importlib.metadata's questions about `deepspeed` and no
    others; finds no modules (those are in sys.modules)."""

    def find_spec(self, fullname, path=None, target=None):
        return None

    def find_distributions(self, context=importlib.metadata.DistributionFinder.Context()):
        name = context.name
        if name is None or name.replace("_", "-").lower() == "deepspeed":
            yield _Distribution()


def install(announce=True):
    """Makes `import deepspeed` (and every deepspeed.* module zero provides) resolve to zero in
    this process. Idempotent. Returns the deepspeed module."""
    package = importlib.import_module("zero._deepspeed")
    # Checked through sys.modules, not a flag: `python -m zero.as_deepspeed` runs this file as
    # __main__, apart from a `zero.as_deepspeed` the script may import and install again.
    if sys.modules.get("deepspeed") is not package:
        for info in pkgutil.walk_packages(package.__path__, "zero._deepspeed."):
            importlib.import_module(info.name)
        for name, module in list(sys.modules.items()):
            if name == "zero._deepspeed" or name.startswith("zero._deepspeed."):
                sys.modules["deepspeed" + name[len("zero._deepspeed"):]] = module
        sys.meta_path.insert(0, _MetadataFinder())
        if announce and os.environ.get("RANK", "0") == "0":
            print(f"zero.as_deepspeed: zero {deepspeed_version().split('+zero')[1]} is serving "
                  f"DeepSpeed's API (as deepspeed {deepspeed_version()})", file=sys.stderr,
                  flush=True)
    return package


USAGE = ("usage: python -m zero.as_deepspeed SCRIPT.py [ARGS...]\n"
         "       python -m zero.as_deepspeed -m MODULE [ARGS...]")


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE, file=sys.stderr if not argv else sys.stdout)
        return 2 if not argv else 0
    if argv[0] == "-m":
        if len(argv) < 2:
            print(f"zero.as_deepspeed: -m needs a module name\n{USAGE}", file=sys.stderr)
            return 2
        module, args = argv[1], argv[2:]
        install()
        sys.argv = [module, *args]
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        return 0
    script, args = argv[0], argv[1:]
    if not os.path.isfile(script):
        print(f"zero.as_deepspeed: '{script}' is not a file: pass the training script's path "
              f"(or -m MODULE)\n{USAGE}", file=sys.stderr)
        return 2
    install()
    sys.argv = [script, *args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))  # as `python script.py` does
    runpy.run_path(script, run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
