/* Expert parallelism's order of received rows (decoder_ep_order.h). */
#include "decoder/decoder_ep_order.h"

int32_t decoder_ep_order(int P, int El, const int32_t *recvc, int32_t *perm, int32_t *loff) {
    int32_t start[P > 0 ? P : 1];
    int32_t at = 0;
    for (int q = 0; q < P; q++) {
        start[q] = at;
        for (int j = 0; j < El; j++) at += recvc[q * El + j];
    }
    int32_t row = 0;
    loff[0] = 0;
    for (int j = 0; j < El; j++) {
        for (int q = 0; q < P; q++) {
            int32_t from = start[q];
            for (int jj = 0; jj < j; jj++) from += recvc[q * El + jj];
            for (int32_t i = 0; i < recvc[q * El + j]; i++) perm[row++] = from + i;
        }
        loff[j + 1] = row;
    }
    return row;
}
