// chat.cpp — a multi-turn chat through a small RAII wrapper over the C ABI.
//   ./chat [MODEL]    then type lines; Ctrl-D quits. MODEL omitted = the default model.
#include <cstdio>
#include <iostream>
#include <memory>
#include <stdexcept>
#include <string>
#include "fastllm.h"

namespace fastllm {

struct Error : std::runtime_error {
    FastllmStatus status;
    Error(FastllmStatus s) : std::runtime_error(std::string(fastllm_status_string(s)) + ": " + fastllm_last_error()), status(s) {}
};

inline void check(FastllmStatus s) {
    if (s != FASTLLM_OK) throw Error(s);
}

class Model {
  public:
    explicit Model(const char *path, unsigned threads = 0) {
        FastllmModelParams p = fastllm_model_params_default();
        p.threads = threads;
        FastllmModel *m = nullptr;
        check(fastllm_model_load(path, &p, &m));
        h_.reset(m);
    }
    FastllmModel *get() const { return h_.get(); }

  private:
    struct Free { void operator()(FastllmModel *m) const { fastllm_model_free(m); } };
    std::unique_ptr<FastllmModel, Free> h_;
};

class Chat {
  public:
    explicit Chat(const Model &m, const char *system = nullptr) : system_(system) {
        FastllmSession *s = nullptr;
        check(fastllm_session_new(m.get(), 0, &s));
        h_.reset(s);
    }
    // Sends a user turn, streaming the answer to `out`; returns the whole answer.
    std::string say(const std::string &text, std::ostream &out, unsigned max_tokens = 96) {
        FastllmGenerateParams p = fastllm_generate_params_default();
        p.chat = true;
        p.system = system_;
        p.max_new_tokens = max_tokens;
        char *reply = nullptr;
        check(fastllm_generate(h_.get(), text.c_str(), &p, &Chat::stream, &out, &reply));
        std::string r(reply ? reply : "");
        fastllm_string_free(reply);
        return r;
    }
    size_t tokens() const { return fastllm_session_length(h_.get()); }

  private:
    static bool stream(void *ud, int32_t, const char *piece, size_t n) {
        static_cast<std::ostream *>(ud)->write(piece, static_cast<std::streamsize>(n)).flush();
        return true;
    }
    struct Free { void operator()(FastllmSession *s) const { fastllm_session_free(s); } };
    std::unique_ptr<FastllmSession, Free> h_;
    const char *system_;
};

}  // namespace fastllm

int main(int argc, char **argv) {
    try {
        fastllm::Model model(argc > 1 ? argv[1] : nullptr, 2);
        fastllm::Chat chat(model, "You are a concise assistant.");
        std::string line;
        std::cerr << "> ";
        while (std::getline(std::cin, line)) {
            if (line.empty()) { std::cerr << "> "; continue; }
            chat.say(line, std::cout);
            std::cout << std::endl;
            std::cerr << "[" << chat.tokens() << " tokens in context]\n> ";
        }
        std::cerr << std::endl;
        return 0;
    } catch (const fastllm::Error &e) {
        std::cerr << "error: " << e.what() << std::endl;
        return 1;
    }
}
