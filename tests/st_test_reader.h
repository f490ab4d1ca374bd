// Test-only safetensors reader: 8-byte little-endian header length, JSON header (Jansson), raw data.
// Reads F32 (and F64 converted to float) and I32 tensors into std::vectors. Not product code.
#pragma once

#include <jansson.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "test_util.h"

namespace st_test {

struct Tensor {
    std::string dtype;
    std::vector<int64_t> shape;
    std::vector<float> f32;   // F32 / F64 / BF16 data
    std::vector<int32_t> i32; // I32 data
    int64_t numel() const {
        int64_t n = 1;
        for (int64_t d : shape) n *= d;
        return n;
    }
};

// Returns false (with *why set) on any malformed input.
inline bool load(const std::string &path, std::map<std::string, Tensor> *out, std::string *why) {
    std::string raw = fsdp_test::read_file(path);
    if (raw.size() < 8) {
        *why = path + ": shorter than 8 bytes";
        return false;
    }
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | (unsigned char)raw[i];
    if (hlen > raw.size() - 8) {
        *why = path + ": header length past end of file";
        return false;
    }
    json_error_t jerr;
    json_t *root = json_loadb(raw.data() + 8, hlen, 0, &jerr);
    if (!root || !json_is_object(root)) {
        *why = path + ": bad JSON header: " + jerr.text;
        if (root) json_decref(root);
        return false;
    }
    size_t data0 = 8 + hlen;
    const char *key;
    json_t *val;
    bool ok = true;
    json_object_foreach(root, key, val) {
        if (std::string(key) == "__metadata__") continue;
        Tensor t;
        json_t *dt = json_object_get(val, "dtype"), *shp = json_object_get(val, "shape"),
               *offs = json_object_get(val, "data_offsets");
        if (!json_is_string(dt) || !json_is_array(shp) || !json_is_array(offs) || json_array_size(offs) != 2) {
            *why = path + ": bad entry " + key;
            ok = false;
            break;
        }
        t.dtype = json_string_value(dt);
        for (size_t i = 0; i < json_array_size(shp); i++) t.shape.push_back(json_integer_value(json_array_get(shp, i)));
        uint64_t b = json_integer_value(json_array_get(offs, 0)), e = json_integer_value(json_array_get(offs, 1));
        if (e < b || data0 + e > raw.size()) {
            *why = path + ": offsets of " + key + " out of range";
            ok = false;
            break;
        }
        size_t n = (size_t)t.numel();
        const char *p = raw.data() + data0 + b;
        if (t.dtype == "F32" && e - b == n * 4) {
            t.f32.resize(n);
            memcpy(t.f32.data(), p, n * 4);
        } else if (t.dtype == "F64" && e - b == n * 8) {
            t.f32.resize(n);
            for (size_t i = 0; i < n; i++) {
                double d;
                memcpy(&d, p + 8 * i, 8);
                t.f32[i] = (float)d;
            }
        } else if (t.dtype == "BF16" && e - b == n * 2) {
            t.f32.resize(n);
            for (size_t i = 0; i < n; i++) {
                uint16_t h;
                memcpy(&h, p + 2 * i, 2);
                uint32_t bits = (uint32_t)h << 16;
                memcpy(&t.f32[i], &bits, 4);
            }
        } else if (t.dtype == "I32" && e - b == n * 4) {
            t.i32.resize(n);
            memcpy(t.i32.data(), p, n * 4);
        } else {
            *why = path + ": unsupported dtype or size for " + key + " (" + t.dtype + ")";
            ok = false;
            break;
        }
        (*out)[key] = std::move(t);
    }
    json_decref(root);
    return ok;
}

}  // namespace st_test
