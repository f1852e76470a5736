# hpcserve_image_cache.sh: the image cache's procedure, which enroot-import.sh and
# apptainer-build.sh share. Sourced by them from their own directory (hpcserve copies it there,
# under this name, into the job directory). The caller defines:
#   say MESSAGE...   its one-line messages
#   valid FILE       FILE is a whole image (a readable squashfs, a whole SIF)
#   make TMP URI     writes the image of URI to TMP (TARGET's name, in a new directory of its
#                    own beside TARGET)
# and calls `cache_image URI TARGET OWNER`.
#
# An image is code the deployment runs as its user, so nothing in the cache is taken for an
# image unless it is the right user's:
# - OWNER empty: the user's own cache. TARGET's directory is made 0700 where missing (its parent,
#   the cache every user of the jobs folder shares, 1777 as /tmp is: anyone adds a directory,
#   nobody removes another's); one another user owns, a link, or one others may write is
#   refused, naming its owner.
# - OWNER named (the site's `container.image_cache.owner`): a cache every user reads and only
#   OWNER writes. OWNER's jobs import into it (0755 directory, 0644 files); anyone else's use an
#   image there only if it, its directory and its digest record are OWNER's, no link, and
#   writable by nobody else; a missing one is refused in one line (exit 2), never imported
#   into a place others read.
# - An image pinned by digest (IMAGE@sha256:<64 hex>) is used only with a record, TARGET.digest,
#   written at its import from that very reference, that names the same digest. A file at
#   TARGET without it (copied by hand, or imported from a tag) is imported again, or refused
#   where it is OWNER's.
# - The import runs under flock on TARGET.lock, in a new directory beside TARGET; its result is
#   checked and only then renamed to TARGET (atomic in one directory), so nobody ever sees a
#   partial TARGET, even where flock only locks per node (Lustre mounted with localflock): at
#   worst several nodes import, and each rename is whole.

# The digest IMAGE pins, or nothing; a malformed pin is refused (exit 2).
pinned_digest() {
  case "$1" in
    *@sha256:*)
      local d=${1##*@}
      [[ "$d" =~ ^sha256:[0-9a-f]{64}$ ]] || {
        say "a pinned image names its digest as @sha256: and 64 lower-case hex digits: $1"
        exit 2; }
      echo "$d" ;;
  esac
}

# PATH is OWNER's, no link, and nobody else may write it
owned_by() {
  [ ! -L "$1" ] && [ -e "$1" ] && [ "$(stat -c %U -- "$1")" = "$2" ] &&
    [ $(( 0$(stat -c %a -- "$1") & 022 )) = 0 ]
}

refuse_dir() {
  say "refusing $1 for images (owner $(stat -c %U -- "$1" 2>&1), mode" \
      "$(stat -c %a -- "$1" 2>&1)): it must be a directory of $2's, not a link, that no one" \
      "else may write"
  exit 2
}

# DIR, where missing, made as the cache wants it: MODE 700 (the user's own part, in a parent
# made 1777 where missing) or 755 (the site's, whose parent the site made)
own_dir() {
  local d=$1 mode=$2
  if [ ! -e "$d" ] && [ ! -L "$d" ]; then
    if [ "$mode" = 700 ] && [ ! -d "${d%/*}" ]; then
      { mkdir -p -- "$(dirname -- "${d%/*}")" && mkdir -m 1777 -- "${d%/*}"; } 2>/dev/null || :
    fi
    mkdir -m "$mode" -- "$d" 2>/dev/null || :
  fi
  [ -d "$d" ] && owned_by "$d" "$me" || refuse_dir "$d" "$me"
}

# TARGET is a whole image of this reference: valid, and where pinned, recorded with its digest
current() {
  valid "$1" || return 1
  [ -z "$want" ] || { owned_by "$1.digest" "$owner" && [ "$(cat -- "$1.digest")" = "$want" ]; }
}

cache_image() {
  local uri=$1 target=$2 dir tmp lock wait_s
  me=$(id -un)
  owner=${3:-$me}
  want=$(pinned_digest "$uri") || exit 2
  dir=$(dirname -- "$target")
  if [ "$owner" != "$me" ]; then
    if [ -e "$dir" ] || [ -L "$dir" ]; then
      [ -d "$dir" ] && owned_by "$dir" "$owner" || refuse_dir "$dir" "$owner"
    fi
    if owned_by "$target" "$owner" && current "$target"; then
      say "$target ($owner's) is up to date"
      exit 0
    fi
    local found=
    if [ -e "$target" ] || [ -L "$target" ]; then
      found=" (what is there is $(stat -c %U -- "$target")'s, mode $(stat -c %a -- "$target"))"
    fi
    say "the site's image cache ($owner's, read-only to you) has no ${want:+verified }image of" \
        "$uri at $target$found: ask $owner to import it (${0##*/} --owner $owner IMAGE" \
        "TARGET), or leave site.container.image_cache unset to import into your own cache"
    exit 2
  fi
  if [ -n "$3" ]; then umask 022; own_dir "$dir" 755; else umask 077; own_dir "$dir" 700; fi

  if current "$target"; then
    say "$target is up to date"
    exit 0
  fi
  # The lock file is never deleted: removing it while another process waits on it would let a
  # third one lock a new file of the same name. It lies in the owner's directory: only their
  # jobs ever wait on it.
  exec {lock}>>"$target.lock"
  wait_s=${HPCSERVE_IMPORT_LOCK_TIMEOUT:-7200}
  say "waiting for the lock on $target.lock (up to ${wait_s}s)"
  if ! flock -w "$wait_s" "$lock"; then
    say "could not lock $target.lock within ${wait_s}s"
    exit 1
  fi
  if current "$target"; then
    say "$target was made by another process"
    exit 0
  fi
  if [ -e "$target" ]; then
    say "$target is not a whole image${want:+ recorded as $want}; making it again"
    rm -f -- "$target" "$target.digest"
  fi

  tmpd=$(mktemp -d -- "$dir/.tmp-XXXXXXXX")  # global: the EXIT trap reads it
  trap 'rm -rf -- "$tmpd"' EXIT
  say "making $target from $uri"
  tmp=$tmpd/${target##*/}
  make "$tmp" "$uri"
  if ! valid "$tmp"; then
    say "the image made from $uri is not whole: $tmp"
    exit 1
  fi
  sync -- "$tmp" 2>/dev/null || true
  if [ -n "$want" ]; then
    printf '%s\n' "$want" >"$tmpd/digest"
    mv -f -- "$tmpd/digest" "$target.digest"
  fi
  mv -f -- "$tmp" "$target"
  rmdir -- "$tmpd"
  trap - EXIT
  say "made $target from $uri"
}
