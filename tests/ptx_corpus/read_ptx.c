/* The emulated driver's own PTX reader, run on files: the interposer's C source included as it
 * stands (no tables: an emulated 12.0 whose ceiling is PTX ISA 8.0, with no real driver and so
 * no device to match code against).  For each file after the mode it prints one number:
 *   text      the .version read from PTX text (major * 100 + minor; 0: none)
 *   link:N    the version cuLinkAddData would refuse input type N (1 PTX, 2 fat binary,
 *             3 host object, 4 library) for (0: handed to the real driver)
 * tests/integration/test_ptx_reader_corpus.py compares it with cumatrix.binary.ptx. */
#include "interposer.c"

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    int link = strncmp(argv[1], "link:", 5) == 0 ? atoi(argv[1] + 5) : 0;
    for (int i = 2; i < argc; i++) {
        size_t n = 0;
        unsigned char *buf = read_file(argv[i], &n);
        if (!buf) return 1;
        printf("%d\n", link ? refused_link_input(link, buf, n) : ptx_text_version((const char *)buf, n));
        free(buf);
    }
    return 0;
}
