#!/usr/bin/env bash
# No file under elements/X includes a header of elements/Y for X != Y, except those of
# common/ and models/ (shared by every element; models/ itself only uses common/).
# Usage: element_includes.sh ROOT (the folder that holds elements/). Lists each offending
# include and exits 1 when there is one.
set -u
root=${1:?usage: element_includes.sh ROOT}
cd "$root/elements" || exit 2
bad=0
for dir in */; do
  x=${dir%/}
  while IFS= read -r hit; do
    file=${hit%%:*}
    inc=$(sed -E 's/^[^"]*#[[:space:]]*include[[:space:]]*"([^"]+)".*/\1/' <<<"${hit#*:*:}")
    if [[ -e $(dirname "$file")/$inc || -e $x/$inc ]]; then
      y=$x  # beside the including file, or under its element's folder (elements/X/sub/)
    elif [[ $inc == */* ]]; then
      y=${inc%%/*}
    elif [[ -e common/$inc ]]; then
      y=common
    else
      y='?'  # not in this folder nor common: found through some other include path
    fi
    ok=0
    case $x in
      common) [[ $y == common ]] && ok=1 ;;
      models) [[ $y == common || $y == models ]] && ok=1 ;;
      *) [[ $y == "$x" || $y == common || $y == models ]] && ok=1 ;;
    esac
    if ((!ok)); then
      echo "elements/$file includes \"$inc\" (elements/$y): element folders share headers only through common/ and models/"
      bad=1
    fi
  done < <(grep -rnE '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' "$x" || true)
done
exit $bad
