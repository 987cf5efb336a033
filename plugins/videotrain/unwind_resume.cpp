/* The plugin's _Unwind_Resume: a jump to the one of the unwinder that libstdc++ raises with.
 *
 * Every landing pad (destructors run while an exception passes) ends in _Unwind_Resume,
 * which must belong to the unwinder that raised the exception, the one libstdc++'s
 * __cxa_throw calls. A GStreamer process holds two: libgcc_s and libunwind.so.8 (nongnu;
 * libgstreamer and libtorch_python need it). Which one a lazily bound reference finds depends
 * on what was loaded, and how, when it is first used: in gst-launch-1.0 both libstdc++ and
 * we found libunwind; in a Python app that ran `import torch` first, libstdc++ had bound
 * libgcc_s while our reference found libunwind, and every exception thrown in the plugin (a
 * config without block_out_channels) aborted the process instead of posting an element error.
 * So at load, after one throw has made libstdc++ bind its _Unwind_RaiseException, we read
 * that binding from libstdc++'s relocations and take _Unwind_Resume from the same library.
 * The symbol is hidden (this plugin's code only) and a bare jump (the unwinder sees the
 * landing pad as its caller). */
#include <dlfcn.h>
#include <elf.h>
#include <link.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

extern "C" {
__attribute__((visibility("hidden"))) void *videotrain_unwind_resume_target = nullptr;
}

namespace {

// The value of `obj`'s relocation slot for symbol `name` (PLT or GOT), or null.
void *bound_address(struct link_map *obj, const char *name) {
  const ElfW(Sym) *symtab = nullptr;
  const char *strtab = nullptr;
  const ElfW(Rela) *tables[2] = {nullptr, nullptr};
  size_t sizes[2] = {0, 0};
  for (const ElfW(Dyn) *d = obj->l_ld; d->d_tag != DT_NULL; d++) {
    switch (d->d_tag) {
      case DT_SYMTAB: symtab = reinterpret_cast<const ElfW(Sym) *>(d->d_un.d_ptr); break;
      case DT_STRTAB: strtab = reinterpret_cast<const char *>(d->d_un.d_ptr); break;
      case DT_JMPREL: tables[0] = reinterpret_cast<const ElfW(Rela) *>(d->d_un.d_ptr); break;
      case DT_PLTRELSZ: sizes[0] = d->d_un.d_val; break;
      case DT_RELA: tables[1] = reinterpret_cast<const ElfW(Rela) *>(d->d_un.d_ptr); break;
      case DT_RELASZ: sizes[1] = d->d_un.d_val; break;
    }
  }
  if (!symtab || !strtab) return nullptr;
  for (int t = 0; t < 2; t++)
    for (size_t i = 0; tables[t] && i < sizes[t] / sizeof(ElfW(Rela)); i++) {
      const ElfW(Rela) &r = tables[t][i];
      size_t sym = ELF64_R_SYM(r.r_info);
      if (sym && strcmp(strtab + symtab[sym].st_name, name) == 0)
        return *reinterpret_cast<void **>(obj->l_addr + r.r_offset);
    }
  return nullptr;
}

void *find_resume() {
  try {  // makes libstdc++ bind _Unwind_RaiseException, if nothing threw before
    throw std::runtime_error("probe");
  } catch (const std::exception &) {
  }
  void *cxx = dlopen("libstdc++.so.6", RTLD_LAZY | RTLD_NOLOAD);
  struct link_map *map = nullptr;
  Dl_info info;
  if (cxx && dlinfo(cxx, RTLD_DI_LINKMAP, &map) == 0 && map) {
    void *raise = bound_address(map, "_Unwind_RaiseException");
    if (raise && dladdr(raise, &info) && info.dli_fname) {
      void *unwinder = dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
      if (void *fn = unwinder ? dlsym(unwinder, "_Unwind_Resume") : nullptr) return fn;
    }
  }
  // libstdc++ linked in some other way: the default lookup, as before.
  return dlsym(RTLD_DEFAULT, "_Unwind_Resume");
}

__attribute__((constructor(101))) void init_resume() {
  videotrain_unwind_resume_target = find_resume();
  if (!videotrain_unwind_resume_target) {
    fputs("gst-videotrain: no _Unwind_Resume found\n", stderr);
    abort();
  }
}

}  // namespace

#if defined(__x86_64__)
asm(".text\n"
    ".globl _Unwind_Resume\n"
    ".hidden _Unwind_Resume\n"
    ".type _Unwind_Resume, @function\n"
    "_Unwind_Resume:\n"
    "  jmp *videotrain_unwind_resume_target(%rip)\n"
    ".size _Unwind_Resume, .-_Unwind_Resume\n");
#elif defined(__aarch64__)
asm(".text\n"
    ".globl _Unwind_Resume\n"
    ".hidden _Unwind_Resume\n"
    ".type _Unwind_Resume, %function\n"
    "_Unwind_Resume:\n"
    "  adrp x16, videotrain_unwind_resume_target\n"
    "  ldr x16, [x16, :lo12:videotrain_unwind_resume_target]\n"
    "  br x16\n"
    ".size _Unwind_Resume, .-_Unwind_Resume\n");
#endif
