// Batch invariance of llama.cpp alone, without Python: the logits of 17 rows decoded one at a time against
// the same rows in batches of 2-17 at position 16 (what localspec's doctor measures through llama-cpp-python),
// for a platform localspec cannot run on here. docs/design.md, "On an ARM CPU", gives what it measured:
// the patched llama.cpp cross-compiled statically for aarch64 and run under qemu on an x86 host.
//
//   tar -xzf llama_cpp_python-0.3.36.tar.gz && cd llama_cpp_python-0.3.36   # then apply patches/series
//   cmake -S vendor/llama.cpp -B arm -DCMAKE_SYSTEM_NAME=Linux -DCMAKE_SYSTEM_PROCESSOR=aarch64 \
//     -DCMAKE_C_COMPILER=aarch64-linux-gnu-gcc -DCMAKE_CXX_COMPILER=aarch64-linux-gnu-g++ -DBUILD_SHARED_LIBS=OFF \
//     -DGGML_OPENMP=OFF -DGGML_NATIVE=OFF -DGGML_CPU_ARM_ARCH=armv8.6-a+dotprod+fp16+i8mm -DGGML_LLAMAFILE=OFF \
//     -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_TOOLS=OFF \
//     -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF && cmake --build arm -j --target llama
//   aarch64-linux-gnu-g++ -O2 -static -std=c++17 batch_probe.cpp -I vendor/llama.cpp/include \
//     -I vendor/llama.cpp/ggml/include arm/src/libllama.a arm/ggml/src/libggml.a arm/ggml/src/libggml-cpu.a \
//     arm/ggml/src/libggml-base.a -lpthread -o batch_probe
//   qemu-aarch64-static -cpu max ./batch_probe MODEL.gguf [extra buffers 1|0] [PREFIX]
//
// PREFIX: also write the rows alone (PREFIX.alone) and the batch of 16 (PREFIX.batch16) as float32, to
// compare two builds' rows.
#include "llama.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

static void decode(llama_context * ctx, const std::vector<llama_token> & toks, int pos0, bool all_logits) {
    llama_batch batch = llama_batch_init((int) toks.size(), 0, 1);
    for (size_t i = 0; i < toks.size(); i++) {
        batch.token[i] = toks[i];
        batch.pos[i] = pos0 + (int) i;
        batch.n_seq_id[i] = 1;
        batch.seq_id[i][0] = 0;
        batch.logits[i] = all_logits || i + 1 == toks.size();
    }
    batch.n_tokens = (int) toks.size();
    if (llama_decode(ctx, batch) != 0) {
        fprintf(stderr, "decode failed\n");
        exit(1);
    }
    llama_batch_free(batch);
}

int main(int argc, char ** argv) {
    const char * path = argv[1];
    bool extra = argc > 2 ? atoi(argv[2]) != 0 : true;
    llama_backend_init();
    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    mp.use_extra_bufts = extra;
    llama_model * model = llama_model_load_from_file(path, mp);
    if (!model) { fprintf(stderr, "load failed\n"); return 1; }
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 512;
    cp.n_batch = 512;
    cp.n_ubatch = 512;
    cp.n_threads = 2;
    cp.n_threads_batch = 2;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    llama_context * ctx = llama_init_from_model(model, cp);
    const llama_vocab * vocab = llama_model_get_vocab(model);
    const int nv = llama_vocab_n_tokens(vocab);

    std::string text =
        "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number, computed iteratively.\"\"\"\n"
        "    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n\n"
        "if __name__ == \"__main__\":\n    for i in range(20):\n        print(i, fibonacci(i))\n";
    std::vector<llama_token> toks(512);
    int n = llama_tokenize(vocab, text.c_str(), (int) text.size(), toks.data(), (int) toks.size(), true, false);
    const int P = 16, R = 17;
    if (n < P + R) { fprintf(stderr, "text too short: %d tokens\n", n); return 1; }
    toks.resize(n);
    std::vector<llama_token> prefix(toks.begin(), toks.begin() + P), rows(toks.begin() + P, toks.begin() + P + R);

    decode(ctx, prefix, 0, false);
    std::vector<std::vector<float>> alone(R);
    for (int i = 0; i < R; i++) {
        decode(ctx, {rows[i]}, P + i, true);
        const float * l = llama_get_logits_ith(ctx, 0);
        alone[i].assign(l, l + nv);
    }
    int bad = 0;
    for (int size : {2, 3, 4, 5, 8, 9, 12, 13, 16, 17}) {
        llama_memory_seq_rm(llama_get_memory(ctx), 0, P, -1);
        decode(ctx, std::vector<llama_token>(rows.begin(), rows.begin() + size), P, true);
        double worst = 0;
        int differing = 0;
        for (int i = 0; i < size; i++) {
            const float * l = llama_get_logits_ith(ctx, i);
            if (memcmp(l, alone[i].data(), nv * sizeof(float)) != 0) differing++;
            for (int t = 0; t < nv; t++) worst = fmax(worst, fabs((double) l[t] - alone[i][t]));
        }
        if (argc > 3 && size == 16) {
            std::string out = std::string(argv[3]);
            FILE * f = fopen((out + ".batch16").c_str(), "wb");
            for (int i = 0; i < size; i++) fwrite(llama_get_logits_ith(ctx, i), sizeof(float), nv, f);
            fclose(f);
            f = fopen((out + ".alone").c_str(), "wb");
            for (int i = 0; i < R; i++) fwrite(alone[i].data(), sizeof(float), nv, f);
            fclose(f);
        }
        printf("batch of %2d: %s (%d of %d rows differ, max |diff| %.3g)\n", size, differing ? "DIFFERS" : "identical",
               differing, size, worst);
        bad += differing > 0;
        // the rest of the rows alone again, so the next size starts from the same cache
        llama_memory_seq_rm(llama_get_memory(ctx), 0, P, -1);
        for (int i = 0; i < R; i++) decode(ctx, {rows[i]}, P + i, true);
    }
    printf("%s, extra buffers %s: %s\n", path, extra ? "on" : "off", bad ? "NOT batch-invariant" : "batch-invariant");
    llama_free(ctx);
    llama_model_free(model);
    return 0;
}
