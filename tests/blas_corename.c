/*
 * blas_corename.c - prints the kernel family OpenBLAS chose in this process
 * (openblas_get_corename), after OPENBLAS_CORETYPE if it is set. Used by
 * tests/blas_coretype.sh to see that a forced core type took effect, so
 * that its runs under a second kernel family cannot pass vacuously.
 */
#include <stdio.h>

char *openblas_get_corename(void); /* OpenBLAS's, not in Debian's cblas.h */

int main(void)
{
    printf("%s\n", openblas_get_corename());
    return 0;
}
