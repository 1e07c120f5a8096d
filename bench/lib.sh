# Sourced by the bench scripts: the environment of the tests and the default data set.
source tests/env.sh
BUILD=${BUILD:-build}
M=$BUILD/meshmoe

# data/gettext.h5, prepared once (about 4 s) when it is not there.
ensure_gettext_data() {
  [ -s data/gettext.h5 ] && return
  mkdir -p data
  $M prep gettext -q -o data/gettext.h5.tmp && mv data/gettext.h5.tmp data/gettext.h5
}
