/* attn.cairo: a thin Lua binding of cairo for attn.plot (not part of the
 * numeric core; lua/attn/core.so links nothing of this).
 *
 * A surface userdata owns one cairo surface and its drawing context. Output
 * goes through cairo's stream functions either to a FILE opened here (so an
 * unwritable path is reported at creation, as nil + message) or to a growing
 * memory buffer that finish() returns as a string. Every argument is checked
 * before cairo sees it: a context that enters an error state stays broken, so
 * misuse (NaN or huge coordinates, invalid UTF-8, bad sizes) is raised as a
 * Lua error instead of being passed on. */
#include <cairo-pdf.h>
#include <cairo-svg.h>
#include <cairo.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <lauxlib.h>
#include <lua.h>

#define SURFACE_MT "attn.cairo.Surface"
/* Bounds: a figure side (pixels or points) and any coordinate or length. */
#define MAX_SIDE 16384
#define MAX_COORD 1e6
#define MAX_DASHES 16

enum kind { KIND_PNG, KIND_SVG, KIND_PDF };

typedef struct {
  cairo_surface_t *surface;
  cairo_t *cr;
  enum kind kind;
  int width, height;
  FILE *file;          /* output file, or NULL for memory output */
  char *buf;           /* memory output */
  size_t len, cap;
  int write_failed;
  int finished;
} surface;

static cairo_status_t write_cb(void *closure, const unsigned char *data, unsigned int n) {
  surface *s = closure;
  if (s->file) {
    if (fwrite(data, 1, n, s->file) != n) {
      s->write_failed = 1;
      return CAIRO_STATUS_WRITE_ERROR;
    }
    return CAIRO_STATUS_SUCCESS;
  }
  if (s->len + n > s->cap) {
    size_t cap = s->cap ? s->cap : 4096;
    while (cap < s->len + n) cap *= 2;
    char *p = realloc(s->buf, cap);
    if (!p) {
      s->write_failed = 1;
      return CAIRO_STATUS_NO_MEMORY;
    }
    s->buf = p;
    s->cap = cap;
  }
  memcpy(s->buf + s->len, data, n);
  s->len += n;
  return CAIRO_STATUS_SUCCESS;
}

static void release(surface *s) {
  if (s->cr) cairo_destroy(s->cr);
  if (s->surface) cairo_surface_destroy(s->surface);
  if (s->file) fclose(s->file);
  free(s->buf);
  s->cr = NULL;
  s->surface = NULL;
  s->file = NULL;
  s->buf = NULL;
  s->len = s->cap = 0;
}

static surface *check_surface(lua_State *L, int idx) {
  surface *s = luaL_checkudata(L, idx, SURFACE_MT);
  if (s->finished || !s->cr) luaL_error(L, "cairo: surface is already finished");
  return s;
}

/* A finite number within the coordinate bound. */
static double check_coord(lua_State *L, int arg, const char *what) {
  double v = luaL_checknumber(L, arg);
  if (!(v >= -MAX_COORD && v <= MAX_COORD))
    luaL_error(L, "cairo: %s must be a finite number within +-1e6, got %f", what, v);
  return v;
}

static double check_unit(lua_State *L, int arg, const char *what) {
  double v = luaL_checknumber(L, arg);
  if (!(v >= 0 && v <= 1)) luaL_error(L, "cairo: %s must be in [0, 1], got %f", what, v);
  return v;
}

static int check_side(lua_State *L, int arg, const char *what) {
  lua_Integer v = luaL_checkinteger(L, arg);
  if (v < 1 || v > MAX_SIDE) luaL_error(L, "cairo: %s must be an integer in 1..%d, got %d", what, MAX_SIDE, (int)v);
  return (int)v;
}

/* cairo's text functions put a context in a permanent error state on invalid
 * UTF-8, so strings are checked here first. */
static int valid_utf8(const unsigned char *p, size_t n) {
  size_t i = 0;
  while (i < n) {
    unsigned c = p[i];
    size_t k;
    unsigned min;
    if (c == 0) return 0;
    if (c < 0x80) { i++; continue; }
    if ((c & 0xE0) == 0xC0) { k = 1; min = 0x80; c &= 0x1F; }
    else if ((c & 0xF0) == 0xE0) { k = 2; min = 0x800; c &= 0x0F; }
    else if ((c & 0xF8) == 0xF0) { k = 3; min = 0x10000; c &= 0x07; }
    else return 0;
    for (size_t j = 1; j <= k; j++) {
      if (i + j >= n || (p[i + j] & 0xC0) != 0x80) return 0;
      c = (c << 6) | (p[i + j] & 0x3F);
    }
    if (c < min || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) return 0;
    i += k + 1;
  }
  return 1;
}

static const char *check_text(lua_State *L, int arg) {
  size_t n;
  const char *str = luaL_checklstring(L, arg, &n);
  /* (with the font size bound, this keeps text within cairo's fixed-point range) */
  if (n > 1024) luaL_error(L, "cairo: text longer than 1024 bytes");
  if (!valid_utf8((const unsigned char *)str, n)) luaL_error(L, "cairo: text is not valid UTF-8 (or contains a zero byte)");
  return str;
}

/* Raises if cairo reports an error on the context (should not happen after
 * the checks above; it is a guard, not a code path). */
static void check_status(lua_State *L, surface *s) {
  cairo_status_t st = cairo_status(s->cr);
  if (st != CAIRO_STATUS_SUCCESS) luaL_error(L, "cairo: %s", cairo_status_to_string(st));
}

/* Pushes a new surface of kind (its image format for png) writing to path
 * (or to memory), or pushes nil, message and returns NULL when path cannot
 * be opened. */
static surface *open_surface(lua_State *L, enum kind kind, cairo_format_t format, int width, int height,
                             const char *path) {
  surface *s = lua_newuserdatauv(L, sizeof *s, 0);
  memset(s, 0, sizeof *s);
  s->kind = kind;
  s->width = width;
  s->height = height;
  luaL_setmetatable(L, SURFACE_MT);
  if (path) {
    s->file = fopen(path, "wb");
    if (!s->file) {
      int e = errno;
      lua_pushnil(L);
      lua_pushfstring(L, "%s: %s", path, strerror(e));
      return NULL;
    }
  }
  switch (s->kind) {
    case KIND_PNG: s->surface = cairo_image_surface_create(format, width, height); break;
    case KIND_SVG: s->surface = cairo_svg_surface_create_for_stream(write_cb, s, width, height); break;
    case KIND_PDF: s->surface = cairo_pdf_surface_create_for_stream(write_cb, s, width, height); break;
  }
  cairo_status_t st = cairo_surface_status(s->surface);
  if (st == CAIRO_STATUS_SUCCESS) {
    s->cr = cairo_create(s->surface);
    st = cairo_status(s->cr);
  }
  if (st != CAIRO_STATUS_SUCCESS) {
    release(s);
    luaL_error(L, "cairo.surface: %s", cairo_status_to_string(st));
  }
  return s;
}

static void check_pixel_count(lua_State *L, int width, int height) {
  if ((double)width * height > 64.0 * 1024 * 1024)
    luaL_error(L, "cairo: a %dx%d image is too large (at most 64 Mpixels)", width, height);
}

/* cairo.surface(format, width, height [, path]) -> surface | nil, message */
static int l_surface(lua_State *L) {
  static const char *const kinds[] = {"png", "svg", "pdf", NULL};
  int kind = luaL_checkoption(L, 1, NULL, kinds);
  int width = check_side(L, 2, "width");
  int height = check_side(L, 3, "height");
  const char *path = luaL_optstring(L, 4, NULL);
  if (kind == KIND_PNG) check_pixel_count(L, width, height);
  return open_surface(L, (enum kind)kind, CAIRO_FORMAT_ARGB32, width, height, path) ? 1 : 2;
}

/* The i-th little-endian float32 of p, as the attn core writes them. */
static float load_f32le(const unsigned char *p, size_t i) {
  p += 4 * i;
  uint32_t b = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
  float v;
  memcpy(&v, &b, sizeof v);
  return v;
}

static uint32_t to_byte(float v) { return v <= 0 ? 0 : v >= 1 ? 255 : (uint32_t)(v * 255.0f + 0.5f); }

/* cairo.image(width, height, channels, pixels [, path]) -> png surface | nil,
 * message: an image surface holding pixels, a string of channels * height *
 * width little-endian float32 values in channel-major order (C, H, W), for
 * channels 1 (gray), 3 (RGB) or 4 (RGBA, not premultiplied). Values are
 * clamped to [0, 1] and rounded to 8 bits; a NaN raises (checked before path
 * is created). Opaque images (1 or 3 channels) are RGB24 surfaces, so finish()
 * writes an RGB PNG; 4 channels give ARGB32 and an RGBA PNG. */
static int l_image(lua_State *L) {
  int width = check_side(L, 1, "width");
  int height = check_side(L, 2, "height");
  lua_Integer channels = luaL_checkinteger(L, 3);
  size_t len;
  const unsigned char *px = (const unsigned char *)luaL_checklstring(L, 4, &len);
  const char *path = luaL_optstring(L, 5, NULL);
  if (channels != 1 && channels != 3 && channels != 4)
    return luaL_error(L, "cairo.image: channels must be 1, 3 or 4, got %d", (int)channels);
  check_pixel_count(L, width, height);
  size_t plane = (size_t)width * (size_t)height, n = plane * (size_t)channels;
  if (len != 4 * n)
    return luaL_error(L, "cairo.image: %d x %d x %d pixels need %d bytes, got %d", (int)channels, height, width,
                      (int)(4 * n), (int)len);
  for (size_t i = 0; i < n; i++) {
    float v = load_f32le(px, i);
    if (v != v) return luaL_error(L, "cairo.image: pixel value %d is NaN", (int)(i + 1));
  }
  surface *s = open_surface(L, KIND_PNG, channels == 4 ? CAIRO_FORMAT_ARGB32 : CAIRO_FORMAT_RGB24, width, height, path);
  if (!s) return 2;
  cairo_surface_flush(s->surface);
  unsigned char *data = cairo_image_surface_get_data(s->surface);
  int stride = cairo_image_surface_get_stride(s->surface);
  for (int y = 0; y < height; y++) {
    for (int x = 0; x < width; x++) {
      size_t at = (size_t)y * (size_t)width + (size_t)x;
      uint32_t c[3], a = channels == 4 ? to_byte(load_f32le(px, 3 * plane + at)) : 255;
      for (int k = 0; k < 3; k++) {
        c[k] = to_byte(load_f32le(px, (channels == 1 ? 0 : (size_t)k) * plane + at));
        if (a != 255) c[k] = (c[k] * a + 127) / 255; /* cairo stores premultiplied colour */
      }
      uint32_t word = a << 24 | c[0] << 16 | c[1] << 8 | c[2];
      memcpy(data + (size_t)y * (size_t)stride + 4 * (size_t)x, &word, sizeof word);
    }
  }
  cairo_surface_mark_dirty(s->surface);
  return 1;
}

/* cairo.read_png(path) -> surface | nil, message: for reading pixels back. */
static int l_read_png(lua_State *L) {
  const char *path = luaL_checkstring(L, 1);
  FILE *f = fopen(path, "rb");
  if (!f) {
    int e = errno;
    lua_pushnil(L);
    lua_pushfstring(L, "%s: %s", path, strerror(e));
    return 2;
  }
  fclose(f);
  cairo_surface_t *img = cairo_image_surface_create_from_png(path);
  cairo_status_t st = cairo_surface_status(img);
  if (st != CAIRO_STATUS_SUCCESS) {
    cairo_surface_destroy(img);
    lua_pushnil(L);
    /* (cairo 1.16 reports a file that is not a PNG as "out of memory") */
    lua_pushfstring(L, "%s: cannot read as PNG (%s)", path, cairo_status_to_string(st));
    return 2;
  }
  surface *s = lua_newuserdatauv(L, sizeof *s, 0);
  memset(s, 0, sizeof *s);
  s->kind = KIND_PNG;
  s->surface = img;
  s->width = cairo_image_surface_get_width(img);
  s->height = cairo_image_surface_get_height(img);
  luaL_setmetatable(L, SURFACE_MT);
  s->cr = cairo_create(img);
  if (cairo_status(s->cr) != CAIRO_STATUS_SUCCESS) {
    release(s);
    return luaL_error(L, "cairo.read_png: out of memory");
  }
  return 1;
}

static int l_size(lua_State *L) {
  surface *s = luaL_checkudata(L, 1, SURFACE_MT);
  lua_pushinteger(L, s->width);
  lua_pushinteger(L, s->height);
  return 2;
}

/* s:set_color(r, g, b [, a]) with components in [0, 1]. */
static int l_set_color(lua_State *L) {
  surface *s = check_surface(L, 1);
  double r = check_unit(L, 2, "red"), g = check_unit(L, 3, "green"), b = check_unit(L, 4, "blue");
  double a = lua_isnoneornil(L, 5) ? 1.0 : check_unit(L, 5, "alpha");
  cairo_set_source_rgba(s->cr, r, g, b, a);
  return 0;
}

static int l_set_line_width(lua_State *L) {
  surface *s = check_surface(L, 1);
  double w = luaL_checknumber(L, 2);
  if (!(w > 0 && w <= 1000)) return luaL_error(L, "cairo: line width must be in (0, 1000], got %f", w);
  cairo_set_line_width(s->cr, w);
  return 0;
}

/* s:set_dash({on, off, ...}) or s:set_dash() for solid lines. */
static int l_set_dash(lua_State *L) {
  surface *s = check_surface(L, 1);
  double d[MAX_DASHES];
  int n = 0;
  if (!lua_isnoneornil(L, 2)) {
    luaL_checktype(L, 2, LUA_TTABLE);
    lua_Integer len = luaL_len(L, 2);
    if (len > MAX_DASHES) return luaL_error(L, "cairo: at most %d dash lengths", MAX_DASHES);
    double total = 0;
    for (int i = 0; i < (int)len; i++) {
      lua_geti(L, 2, i + 1);
      int ok;
      d[i] = lua_tonumberx(L, -1, &ok);
      lua_pop(L, 1);
      if (!ok || !(d[i] >= 0 && d[i] <= 1000)) return luaL_error(L, "cairo: dash length %d must be a number in [0, 1000]", i + 1);
      total += d[i];
    }
    if (len > 0 && total <= 0) return luaL_error(L, "cairo: dash lengths must not all be zero");
    n = (int)len;
  }
  cairo_set_dash(s->cr, d, n, 0);
  return 0;
}

static int l_rectangle(lua_State *L) {
  surface *s = check_surface(L, 1);
  double x = check_coord(L, 2, "x"), y = check_coord(L, 3, "y");
  double w = check_coord(L, 4, "width"), h = check_coord(L, 5, "height");
  cairo_rectangle(s->cr, x, y, w, h);
  return 0;
}

static int l_move_to(lua_State *L) {
  surface *s = check_surface(L, 1);
  cairo_move_to(s->cr, check_coord(L, 2, "x"), check_coord(L, 3, "y"));
  return 0;
}

static int l_line_to(lua_State *L) {
  surface *s = check_surface(L, 1);
  cairo_line_to(s->cr, check_coord(L, 2, "x"), check_coord(L, 3, "y"));
  return 0;
}

static int l_close_path(lua_State *L) {
  cairo_close_path(check_surface(L, 1)->cr);
  return 0;
}

static int l_fill(lua_State *L) {
  surface *s = check_surface(L, 1);
  cairo_fill(s->cr);
  check_status(L, s);
  return 0;
}

static int l_stroke(lua_State *L) {
  surface *s = check_surface(L, 1);
  cairo_stroke(s->cr);
  check_status(L, s);
  return 0;
}

/* s:font(family, size [, bold]) through cairo's simple font selection
 * (fontconfig picks the face; DejaVu Sans covers the corpus' letters). */
static int l_font(lua_State *L) {
  surface *s = check_surface(L, 1);
  const char *family = check_text(L, 2);
  double size = luaL_checknumber(L, 3);
  if (!(size > 0 && size <= 200)) return luaL_error(L, "cairo: font size must be in (0, 200], got %f", size);
  cairo_select_font_face(s->cr, family, CAIRO_FONT_SLANT_NORMAL,
                         lua_toboolean(L, 4) ? CAIRO_FONT_WEIGHT_BOLD : CAIRO_FONT_WEIGHT_NORMAL);
  cairo_set_font_size(s->cr, size);
  check_status(L, s);
  return 0;
}

/* s:text(x, y, str [, angle [, align]]): str with its baseline origin at
 * (x, y), turned by angle degrees clockwise about that point, and shifted
 * along the baseline by align times its advance (0 start, 0.5 middle, 1 end). */
static int l_text(lua_State *L) {
  surface *s = check_surface(L, 1);
  double x = check_coord(L, 2, "x"), y = check_coord(L, 3, "y");
  const char *str = check_text(L, 4);
  double angle = lua_isnoneornil(L, 5) ? 0 : luaL_checknumber(L, 5);
  double align = lua_isnoneornil(L, 6) ? 0 : check_unit(L, 6, "align");
  if (!(angle >= -360 && angle <= 360)) return luaL_error(L, "cairo: angle must be in [-360, 360] degrees, got %f", angle);
  cairo_text_extents_t e;
  cairo_text_extents(s->cr, str, &e);
  cairo_save(s->cr);
  cairo_translate(s->cr, x, y);
  cairo_rotate(s->cr, angle * (3.14159265358979323846 / 180));
  cairo_move_to(s->cr, -align * e.x_advance, 0);
  cairo_show_text(s->cr, str);
  cairo_new_path(s->cr);
  cairo_restore(s->cr);
  check_status(L, s);
  return 0;
}

/* s:text_extents(str) -> advance, ink width, ink height, x bearing, y bearing */
static int l_text_extents(lua_State *L) {
  surface *s = check_surface(L, 1);
  const char *str = check_text(L, 2);
  cairo_text_extents_t e;
  cairo_text_extents(s->cr, str, &e);
  check_status(L, s);
  lua_pushnumber(L, e.x_advance);
  lua_pushnumber(L, e.width);
  lua_pushnumber(L, e.height);
  lua_pushnumber(L, e.x_bearing);
  lua_pushnumber(L, e.y_bearing);
  return 5;
}

/* s:font_extents() -> ascent, descent, line height */
static int l_font_extents(lua_State *L) {
  surface *s = check_surface(L, 1);
  cairo_font_extents_t e;
  cairo_font_extents(s->cr, &e);
  check_status(L, s);
  lua_pushnumber(L, e.ascent);
  lua_pushnumber(L, e.descent);
  lua_pushnumber(L, e.height);
  return 3;
}

/* The flushed pixels of image surface s (ARGB32 or RGB24: an opaque PNG reads back as RGB24,
 * whose top byte is unused), with their row stride and format; errors name `what`. */
static const unsigned char *image_pixels(lua_State *L, surface *s, const char *what, int *stride,
                                         cairo_format_t *format) {
  cairo_surface_flush(s->surface);
  const unsigned char *data = cairo_image_surface_get_data(s->surface);
  *stride = cairo_image_surface_get_stride(s->surface);
  *format = cairo_image_surface_get_format(s->surface);
  if (!data) luaL_error(L, "cairo: image data not available");
  if (*format != CAIRO_FORMAT_ARGB32 && *format != CAIRO_FORMAT_RGB24)
    luaL_error(L, "cairo: %s reads ARGB32 and RGB24 images only", what);
  return data;
}

/* The pixel at p, unpremultiplied: red, green and blue into rgb (0..255); returns alpha. */
static unsigned read_pixel(const unsigned char *p, cairo_format_t format, unsigned rgb[3]) {
  uint32_t px;
  memcpy(&px, p, sizeof px);
  unsigned a = format == CAIRO_FORMAT_RGB24 ? 255 : px >> 24, c[3] = {(px >> 16) & 255, (px >> 8) & 255, px & 255};
  for (int i = 0; i < 3; i++) rgb[i] = a ? (c[i] * 255 + a / 2) / a : 0;
  return a;
}

/* s:pixel(x, y) -> r, g, b, a (0..255, unpremultiplied) of the pixel covering
 * the point (x, y) on a PNG (image) surface; 0-based like drawing coordinates. */
static int l_pixel(lua_State *L) {
  surface *s = check_surface(L, 1);
  if (s->kind != KIND_PNG) return luaL_error(L, "cairo: pixel() needs a png surface");
  double fx = luaL_checknumber(L, 2), fy = luaL_checknumber(L, 3);
  if (!(fx >= 0 && fx < s->width && fy >= 0 && fy < s->height))
    return luaL_error(L, "cairo: pixel (%f, %f) outside the %dx%d image", fx, fy, s->width, s->height);
  int stride;
  cairo_format_t format;
  const unsigned char *data = image_pixels(L, s, "pixel()", &stride, &format);
  unsigned rgb[3], a = read_pixel(data + (size_t)floor(fy) * (size_t)stride + 4 * (size_t)floor(fx), format, rgb);
  for (int i = 0; i < 3; i++) lua_pushinteger(L, rgb[i]);
  lua_pushinteger(L, a);
  return 4;
}

/* s:rgba() -> string, has_alpha: the pixels of a PNG (image) surface as
 * height * width * 4 bytes, row by row, each red, green, blue, alpha (0..255,
 * not premultiplied); has_alpha is false for an opaque (RGB24) image, as
 * cairo reads a PNG without an alpha channel. */
static int l_rgba(lua_State *L) {
  surface *s = check_surface(L, 1);
  if (s->kind != KIND_PNG) return luaL_error(L, "cairo: rgba() needs a png surface");
  int stride;
  cairo_format_t format;
  const unsigned char *data = image_pixels(L, s, "rgba()", &stride, &format);
  size_t n = (size_t)s->width * (size_t)s->height * 4;
  luaL_Buffer b;
  unsigned char *out = (unsigned char *)luaL_buffinitsize(L, &b, n);
  for (int y = 0; y < s->height; y++) {
    for (int x = 0; x < s->width; x++) {
      unsigned rgb[3], a = read_pixel(data + (size_t)y * (size_t)stride + 4 * (size_t)x, format, rgb);
      unsigned char *o = out + ((size_t)y * (size_t)s->width + (size_t)x) * 4;
      for (int i = 0; i < 3; i++) o[i] = (unsigned char)rgb[i];
      o[3] = (unsigned char)a;
    }
  }
  luaL_pushresultsize(&b, n);
  lua_pushboolean(L, format == CAIRO_FORMAT_ARGB32);
  return 2;
}

/* s:finish() -> true (file output) or the bytes (memory output), or nil,
 * message when writing failed. The surface is unusable afterwards. */
static int l_finish(lua_State *L) {
  surface *s = check_surface(L, 1);
  cairo_status_t st = CAIRO_STATUS_SUCCESS;
  cairo_destroy(s->cr);
  s->cr = NULL;
  if (s->kind == KIND_PNG) st = cairo_surface_write_to_png_stream(s->surface, write_cb, s);
  cairo_surface_finish(s->surface);
  if (st == CAIRO_STATUS_SUCCESS) st = cairo_surface_status(s->surface);
  s->finished = 1;
  int failed = st != CAIRO_STATUS_SUCCESS || s->write_failed;
  int e = 0;
  if (s->file) {
    if (fclose(s->file) != 0 && !failed) {
      e = errno;
      failed = 1;
    }
    s->file = NULL;
    if (failed) {
      lua_pushnil(L);
      lua_pushstring(L, e ? strerror(e) : s->write_failed ? "write error" : cairo_status_to_string(st));
    } else {
      lua_pushboolean(L, 1);
    }
  } else if (failed) {
    lua_pushnil(L);
    lua_pushstring(L, s->write_failed ? "out of memory" : cairo_status_to_string(st));
  } else {
    lua_pushlstring(L, s->buf ? s->buf : "", s->len);
  }
  release(s);
  return failed ? 2 : 1;
}

static int l_gc(lua_State *L) {
  surface *s = luaL_checkudata(L, 1, SURFACE_MT);
  release(s);
  s->finished = 1;
  return 0;
}

static int l_tostring(lua_State *L) {
  surface *s = luaL_checkudata(L, 1, SURFACE_MT);
  static const char *const names[] = {"png", "svg", "pdf"};
  lua_pushfstring(L, "cairo surface (%s, %dx%d%s)", names[s->kind], s->width, s->height, s->finished ? ", finished" : "");
  return 1;
}

static const luaL_Reg methods[] = {
    {"size", l_size},       {"set_color", l_set_color}, {"set_line_width", l_set_line_width},
    {"set_dash", l_set_dash}, {"rectangle", l_rectangle}, {"move_to", l_move_to},
    {"line_to", l_line_to}, {"close_path", l_close_path}, {"fill", l_fill},
    {"stroke", l_stroke},   {"font", l_font},           {"text", l_text},
    {"text_extents", l_text_extents}, {"font_extents", l_font_extents}, {"pixel", l_pixel},
    {"rgba", l_rgba},       {"finish", l_finish},       {NULL, NULL}};

static const luaL_Reg functions[] = {
    {"surface", l_surface}, {"image", l_image}, {"read_png", l_read_png}, {NULL, NULL}};

int luaopen_attn_cairo(lua_State *L);

int luaopen_attn_cairo(lua_State *L) {
  luaL_newmetatable(L, SURFACE_MT);
  luaL_newlib(L, methods);
  lua_setfield(L, -2, "__index");
  lua_pushcfunction(L, l_gc);
  lua_setfield(L, -2, "__gc");
  lua_pushcfunction(L, l_gc);
  lua_setfield(L, -2, "__close");
  lua_pushcfunction(L, l_tostring);
  lua_setfield(L, -2, "__tostring");
  lua_pop(L, 1);
  luaL_newlib(L, functions);
  lua_pushstring(L, cairo_version_string());
  lua_setfield(L, -2, "version");
  lua_pushinteger(L, MAX_SIDE);
  lua_setfield(L, -2, "max_side");
  return 1;
}
