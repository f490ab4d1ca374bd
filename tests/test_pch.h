// The headers nearly every test file includes, precompiled once per build (Makefile: TEST_PCH): parsing
// GoogleTest and the standard library is most of what a test file costs to compile at -Og. Each test file
// still includes what it uses; a file compiled without the precompiled header means the same.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <vector>
