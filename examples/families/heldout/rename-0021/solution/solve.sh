#!/bin/bash
mv input.txt summary.txt
