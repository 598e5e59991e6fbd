#!/usr/bin/env bash
# Installs the Debian packages that benchmarks and the tests use: python3 with numpy,
# PyTorch and zstandard (the DataLoader baseline, the trainer client), PIL and
# torchvision (the image baseline and the pixel references image fields are checked
# against), libturbojpeg0 and libjpeg62-turbo (libjpeg-turbo, which image fields load
# at run time: TurboJPEG, and libjpeg to decode only a crop's rows), pip,
# setuptools and wheel (building and installing the client from the repository,
# offline), curl (the raw fetch ceiling), bc, and mypy (the Python client's type
# check: mypy --strict client/python/shardload). Idempotent: installs only what is
# missing.
set -euo pipefail
pkgs=(python3 python3-numpy python3-torch python3-torchvision python3-pil python3-zstandard python3-pip python3-setuptools python3-wheel libturbojpeg0 libjpeg62-turbo curl bc mypy)
missing=()
for p in "${pkgs[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [[ ${#missing[@]} -eq 0 ]]; then
	echo "deps: all installed (${pkgs[*]})"
	exit 0
fi
echo "deps: installing ${missing[*]}" >&2
sudo=()
[[ $(id -u) -eq 0 ]] || sudo=(sudo)
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "deps: installed ${missing[*]}"
