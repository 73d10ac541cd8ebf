def jakul(path, values):
    with open(path, "w") as out:
        for v in values:
            out.write(f"{v}\n")
