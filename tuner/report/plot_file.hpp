// Writing the report's figure: SVG as is, PNG through an SVG converter found on $PATH
// (rsvg-convert, then ImageMagick's magick or convert, then inkscape), run as an argv with no
// shell. Either way the file appears whole or not at all (temporary file beside it, then rename).
#pragma once
#include <string>
#include <vector>

#include "core/output_file.hpp"

namespace attntune::report {

enum class PlotFormat { kSvg, kPng };

// From the name's extension (case-insensitive); InputError (exit 2) for anything but .svg and .png.
PlotFormat plot_format(const std::string& path);

struct Converter {
  std::string name;  // rsvg-convert | magick | convert | inkscape
  std::string path;  // the executable found on $PATH
};
// The converters on $PATH, in the order they are tried.
std::vector<Converter> find_converters();

// The line PNG output fails with when no converter is on $PATH (EnvError, exit 3).
std::string no_converter_message(const std::string& path);

// SVG: writes `svg`. PNG: converts it with the first converter that succeeds; EnvError (exit 3)
// when none is on $PATH or none produced a PNG. Written by the output writer
// (core/output_file.hpp): never over one of `databases` or its companions, whole or not at all, a
// full disk exit 3, any other failure to write InputError.
void write_plot(const std::string& path, const std::string& svg, const ProtectedDatabases& databases = {});

}  // namespace attntune::report
