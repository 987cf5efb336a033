#!/usr/bin/env bash
# The gtest wrap's fallback builds: a throw-away project takes GoogleTest from subprojects/
# (Debian's googletest sources stand in for the wrap's git checkout, which needs a network)
# with our packagefiles/googletest/meson.build, forced over the system package, and runs a
# test that uses gtest and gmock through the names the wrap provides.
set -euo pipefail
src=${VIDEOTRAIN_SOURCE_DIR:?}
gsrc=${GTEST_SOURCES:-/usr/src/googletest}
[[ -f $gsrc/googletest/src/gtest-all.cc ]] || { echo "no GoogleTest sources at $gsrc (Debian package googletest)"; exit 1; }
work=$(mktemp -d "${TMPDIR:-/tmp}/videotrain-wrap-XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/subprojects"
cp "$src/subprojects/gtest.wrap" "$work/subprojects/"
cp -r "$gsrc" "$work/subprojects/googletest"          # where the wrap's checkout would be
cp "$src/subprojects/packagefiles/googletest/meson.build" "$work/subprojects/googletest/"
cat > "$work/meson.build" <<'M'
project('wrap-check', 'cpp', default_options : ['cpp_std=c++17'])
gtest = dependency('gtest', main : false)
gmock = dependency('gmock')
assert(gtest.type_name() == 'internal', 'gtest came from ' + gtest.type_name() + ', not the wrap')
test('t', executable('t', 't.cpp', dependencies : [gtest, gmock]))
M
cat > "$work/t.cpp" <<'C'
#include <gmock/gmock.h>
#include <gtest/gtest.h>
TEST(Wrap, Works) { EXPECT_THAT(std::vector<int>({1, 2}), testing::ElementsAre(1, 2)); }
int main(int argc, char **argv) { testing::InitGoogleMock(&argc, argv); return RUN_ALL_TESTS(); }
C
cd "$work"
meson setup b --wrap-mode=nodownload --force-fallback-for=gtest,gmock >setup.log 2>&1 || { cat setup.log; exit 1; }
grep -q "Dependency gtest from subproject subprojects/googletest found: YES" setup.log || { cat setup.log; echo "googletest was not taken from subprojects/"; exit 1; }
ninja -C b >build.log 2>&1 || { tail -30 build.log; exit 1; }
./b/t
echo "gtest.wrap fallback: built GoogleTest from subprojects/ and ran a gtest+gmock test"
