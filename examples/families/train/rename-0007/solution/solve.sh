#!/bin/bash
mv input.txt final.txt
