"""`oci_layer`: one deterministic image layer (tar, gzip or zstd blob, descriptor) from a root file system, a venv and files.

`layer_compression` is the build setting that picks every layer's compression: `gzip` (the default) or
`zstd` (`--//rules:layer_compression=zstd`, or `--config=zstd`).
"""

load(":common.bzl", "ACTION_ENV", "label_string", "tool")
load(":debian.bzl", "DebianRootfsInfo")
load(":python_venv.bzl", "VenvInfo")

_COMPRESSIONS = {"gzip": ".tar.gz", "zstd": ".tar.zst"}

LayerCompressionInfo = provider(
    doc = "The value of the layer compression build setting.",
    fields = {"value": "`gzip` or `zstd`"},
)

def _layer_compression_impl(ctx):
    if ctx.build_setting_value not in _COMPRESSIONS:
        fail("sparkseal: --%s=%s: expected one of %s" % (
            label_string(ctx.label),
            ctx.build_setting_value,
            ", ".join(sorted(_COMPRESSIONS)),
        ))
    return [LayerCompressionInfo(value = ctx.build_setting_value)]

layer_compression = rule(
    implementation = _layer_compression_impl,
    doc = "A string flag: the compression of every image layer, `gzip` (default) or `zstd`.",
    build_setting = config.string(flag = True),
)

def zstd_package(files):
    """The `zstandard/__init__.py` of the unpacked zstandard wheel among `files` (//rules:zstd_module), or None.

    Its directory's parent is the `site` an action or the load program puts on its Python path.
    """
    inits = [f for f in files if f.short_path.endswith("/site/zstandard/__init__.py")]
    return inits[0] if len(inits) == 1 else None

OciLayerInfo = provider(
    doc = "One image layer written by oci_layer.",
    fields = {
        "blob": "File: the compressed layer (gzip, or zstd with --//rules:layer_compression=zstd)",
        "descriptor": "File: JSON with diff_id, digest, mediaType and size",
        "tar": "File: the uncompressed layer, or None unless keep_tar",
        "scan_report": "File: the layer's clean secret-scan report (written by the layer's action), or " +
                       "None when scan = False",
        "modules": "File: the module manifest of the layer's wheels (sparkseal/core/manifest.py), or None " +
                   "for a layer without wheels",
    },
)

def _image_join(dest, rel):
    return dest.rstrip("/") + "/" + rel

def _package_relative(f, label):
    # A file of a filegroup keeps its path below the package that declares the label.
    path = f.short_path
    if path.startswith("../"):
        path = path.split("/", 2)[2]
    prefix = label.package + "/" if label.package else ""
    if not path.startswith(prefix):
        fail("sparkseal: %s is not below package '%s' of %s" % (f.short_path, label.package, label_string(label)))
    return path[len(prefix):]

def _oci_layer_impl(ctx):
    # The plain tar is only for inspection (diffoscope); big layers skip it and keep just the gzip blob.
    tar = ctx.actions.declare_file(ctx.label.name + ".tar") if ctx.attr.keep_tar else None
    compression = ctx.attr._compression[LayerCompressionInfo].value
    blob = ctx.actions.declare_file(ctx.label.name + _COMPRESSIONS[compression])
    descriptor = ctx.actions.declare_file(ctx.label.name + ".json")
    # A venv without wheels installs nothing; one with wheels also writes the module manifest of their files.
    venv = ctx.attr.venv[VenvInfo] if ctx.attr.venv and ctx.attr.venv[VenvInfo].wheels else None
    modules = ctx.actions.declare_file(ctx.label.name + ".modules.json") if venv else None
    args = ctx.actions.args()
    args.use_param_file("@%s", use_always = True)
    args.set_param_file_format("multiline")
    inputs = []
    for target, dest in ctx.attr.trees.items():
        for f in target.files.to_list():
            if f.is_directory:
                args.add_all(["--tree", f.path, dest], expand_directories = False)
            else:
                args.add_all(["--file", f.path, _image_join(dest, _package_relative(f, target.label))])
            inputs.append(f)
    rootfs = ctx.attr.rootfs[DebianRootfsInfo] if ctx.attr.rootfs else None
    if rootfs:
        # Unpacked inside this action (sparkseal/install/debian_rootfs.py): no rootfs tree is an output.
        args.add_all(rootfs.debs, before_each = "--deb")
        args.add_all(["--deb-lock", rootfs.lock, "--deb-exclude", rootfs.exclude])
        inputs += rootfs.debs + [rootfs.lock]
    for target, dest in ctx.attr.files.items():
        files = target.files.to_list()
        if len(files) != 1 or files[0].is_directory:
            fail("sparkseal: files: %s must be one regular file, got %d files" % (label_string(target.label), len(files)))
        args.add_all(["--file", files[0].path, dest])
        inputs.append(files[0])
    for target, dest in ctx.attr.links.items():
        for f in target.files.to_list():
            args.add_all(["--links", f.path, dest])
            inputs.append(f)
    for target, dest in ctx.attr.dirs.items():
        for f in target.files.to_list():
            args.add_all(["--dirs", f.path, dest])
            inputs.append(f)
    for dest, target in ctx.attr.symlinks.items():
        args.add_all(["--symlink", dest, target])
    for dest in ctx.attr.directories:
        args.add_all(["--dir", dest])
    for dest, mode in ctx.attr.modes.items():
        args.add_all(["--mode", dest, mode])
    if venv:
        args.add_all(venv.wheels, before_each = "--wheel")
        args.add_all(["--platform", venv.platform, "--installer", venv.installer])
        args.add_all(["--venv", venv.path, "--modules", modules])
        if not venv.pyvenv_cfg:
            args.add("--no-pyvenv-cfg")
        if venv.bytecode:
            args.add("--bytecode")
        inputs += venv.wheels + [venv.installer]
        if venv.replaces:
            args.add("--replaces", venv.replaces)
            inputs.append(venv.replaces)
        if venv.split:
            if ctx.attr.trees:
                fail("sparkseal: %s: split needs wheels and no trees: it splits the installed wheels only " % (
                    label_string(ctx.label)
                ) + "(venv %s has a split, and the layer has trees)" % label_string(ctx.attr.venv.label))
            args.add_all(["--split", venv.split, "--split-part", venv.split_part])
            inputs.append(venv.split)
    if tar:
        args.add("--tar", tar)
    tools = []
    if compression == "zstd":
        # The locked zstandard wheel of the build host, unpacked (rules/private/host_wheel.bzl).
        package = zstd_package(ctx.files._zstd_module)
        if not package:
            fail("sparkseal: %s: zstd layers need @zstandard//:site (host_wheel in the WORKSPACE)" % label_string(ctx.label))
        args.add_all(["--compression", "zstd", "--zstd-site", package.dirname.rpartition("/")[0]])
        tools += ctx.files._zstd_module
    args.add_all(["--blob", blob, "--descriptor", descriptor])

    # The scan reads the layer's files where the action has them, before it writes anything; a layer
    # with a finding fails and writes no output. The report is written only for a clean layer.
    scan_report = ctx.actions.declare_file(ctx.label.name + ".scan.json") if ctx.attr.scan else None
    requirements = {"block-network": "1"}
    if scan_report:
        args.add_all(["--label", label_string(ctx.label), "--scan-report", scan_report])
        args.add("--scanner", ctx.executable._scanner)
        tools.append(ctx.executable._scanner)
        if ctx.file.scan_allow:
            args.add("--scan-allow", ctx.file.scan_allow)
            inputs.append(ctx.file.scan_allow)

        # The scanner binary is the one the secret_scanner repository fetched for this host's CPU; a
        # remote worker of another CPU could not run it. The layer is still cached remotely.
        requirements["no-remote-exec"] = "1"
    outputs = [f for f in (tar, blob, descriptor, modules, scan_report) if f]
    ctx.actions.run(
        executable = ctx.executable._tool,
        arguments = [args],
        inputs = inputs,
        tools = tools,
        outputs = outputs,
        env = ACTION_ENV,
        mnemonic = "OciLayer",
        progress_message = "%s image layer %s" % ("Writing and scanning" if scan_report else "Writing", ctx.label),
        execution_requirements = requirements,
    )
    layer_files = [f for f in (tar, blob, descriptor, modules) if f]
    return [
        DefaultInfo(files = depset(layer_files)),
        OciLayerInfo(blob = blob, descriptor = descriptor, tar = tar, scan_report = scan_report, modules = modules),
        OutputGroupInfo(scan = depset([scan_report] if scan_report else [])),
    ]

oci_layer = rule(
    implementation = _oci_layer_impl,
    doc = """One OCI image layer: `name.tar.gz` (`name.tar.zst` with zstd layers) and `name.json`, plus `name.tar` with keep_tar (see sparkseal/actions/oci_layer.py).

A tree's links and permission bits are not read (the sandbox hides them): declare links in `links`
specs or `symlinks`; a file is 0755 when it starts with ELF magic or `#!`, else 0644, unless `modes`
says otherwise. Empty directories of a tree are not written; declare them in `dirs` specs (with mode
and owner) or `directories`.

A layer holds a root file system (`rootfs`, a debian_rootfs), a virtual environment (`venv`, a
python_venv) and files; what each of those may combine is checked by its own rule. The `venv`'s wheels
are installed in a scratch directory of the layer's action that only the layer's tar keeps: no
installed tree is a build output. Such a layer also writes `name.modules.json`, the module manifest of the
wheels' files, which `module_manifest(layers = ...)` merges into the image's; with the venv's `bytecode`,
the reproducible unchecked-hash pycs are in each distribution's RECORD and in that manifest, so that no
rank compiles a module at start-up.""",
    attrs = {
        "trees": attr.label_keyed_string_dict(
            allow_files = True,
            doc = "Tree artifact (or files, kept at their path below the label's package) -> image prefix.",
        ),
        "rootfs": attr.label(
            providers = [DebianRootfsInfo],
            doc = "A debian_rootfs written at `/`: its locked .debs, unpacked in the layer's own action " +
                  "(no rootfs tree is built), with their links and directories (modes and owners).",
        ),
        "files": attr.label_keyed_string_dict(allow_files = True, doc = "One file -> image path."),
        "links": attr.label_keyed_string_dict(
            allow_files = [".json"],
            doc = "Links spec {\"relative/path\": \"target\"} -> image prefix.",
        ),
        "dirs": attr.label_keyed_string_dict(
            allow_files = [".json"],
            doc = "Dirs spec {\"relative/path\": {\"mode\": \"0755\", \"uid\": 0, \"gid\": 0}} -> image prefix.",
        ),
        "symlinks": attr.string_dict(doc = "Image path -> symlink target."),
        "directories": attr.string_list(doc = "Image directories to write even when empty."),
        "modes": attr.string_dict(doc = "Image path -> octal mode (files 0644/0755, dirs 0755/1777)."),
        "venv": attr.label(
            providers = [VenvInfo],
            doc = "A python_venv: its wheels are installed in the layer's own action at the venv's path " +
                  "(no installed tree is built), with the module manifest of their files.",
        ),
        "keep_tar": attr.bool(doc = "Also write `name.tar`, the uncompressed layer (for inspection)."),
        "scan": attr.bool(
            default = True,
            doc = "Scan the layer for secrets and private data (`sparkseal scan` rules: ours and the locked " +
                  "Kingfisher catalogue's); a finding fails the build.",
        ),
        "scan_allow": attr.label(
            allow_single_file = [".json"],
            doc = "Allow-list of the scan (`.sparkseal-scan-allow.json`; paths are paths inside the image).",
        ),
        "_tool": tool("//sparkseal/actions:oci_layer"),
        "_compression": attr.label(default = Label("//rules:layer_compression")),
        # The zstandard wheel when --//rules:layer_compression=zstd, else nothing (no download).
        "_zstd_module": attr.label(default = Label("//rules:zstd_module"), cfg = "exec"),
        # The maintained rule catalogue (Kingfisher), locked in //third_party/scan:scanner.lock.json.
        "_scanner": attr.label(
            default = Label("@secret_scanner//:kingfisher"),
            executable = True,
            allow_single_file = True,
            cfg = "exec",
        ),
    },
)
