// The recipe's `model:` map of a YAML text, read by decoder_spec_from_value (the tests of the decoder's
// config, its Hugging Face keys and the padding row).
#ifndef FSDP_TESTS_DECODER_YAML_UTIL_H
#define FSDP_TESTS_DECODER_YAML_UTIL_H

#include <gtest/gtest.h>

#include <string>

extern "C" {
#include "decoder/decoder_spec.h"
#include "pipeline/yaml_load.h"
}

namespace fsdp_test {

// Parses `yaml` (a document whose top level holds `model:`) and runs decoder_spec_from_value; the error's
// message in *msg (may be NULL).
inline int from_yaml(const std::string &yaml, decoder_config *c, std::string *msg) {
    fsdp_value *root = nullptr;
    fsdp_err err;
    fsdp_err_clear(&err);
    int rc = yaml_load_string(yaml.data(), yaml.size(), "m.yaml", 0, 0, &root, &err);
    EXPECT_EQ(rc, 0) << err.msg;
    if (rc) return rc;
    rc = decoder_spec_from_value(c, fsdp_value_get(root, "model"), &err);
    if (msg) *msg = err.msg;
    val_free(root);
    return rc;
}

}  // namespace fsdp_test

#endif
