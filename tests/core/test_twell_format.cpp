#include <gtest/gtest.h>

#include "twell/formats/twell_format.h"

TEST(TwellFormat, Placeholder) { SUCCEED(); }
