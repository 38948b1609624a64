"""Where to install the Python client under a prefix (plugins/sdk/meson.build).

    python_dir.py PREFIX DEFAULT

Prints DEFAULT (meson's choice) when the interpreter searches it, else the first directory of the
interpreter's module path (site-packages, dist-packages, the user site) that lies under PREFIX, else
DEFAULT again.
"""
import os
import site
import sys


def under(path, prefix):
    path, prefix = os.path.abspath(path), os.path.abspath(prefix)
    return path == prefix or path.startswith(prefix.rstrip(os.sep) + os.sep)


def main():
    prefix, default = sys.argv[1], sys.argv[2]
    candidates = [p for p in sys.path if p.endswith(("site-packages", "dist-packages"))]
    candidates += site.getsitepackages()
    if site.ENABLE_USER_SITE is not False:
        candidates.append(site.getusersitepackages())
    candidates = [os.path.abspath(p) for p in candidates]
    if os.path.abspath(default) in candidates:
        print(default)
        return
    for path in candidates:
        if under(path, prefix):
            print(path)
            return
    print(default)


main()
